"""The TPU generations this project knows, each number with its public source (the module
docstring of :mod:`infra.accelerators` says how accelerator types, hosts, zones and runtime
versions are read from them)."""

from __future__ import annotations

from infra.accelerators.generation import COMPUTE_ENGINE, GKE, QUEUED_RESOURCE, Generation

# Source addresses (the stored copies of these pages were read; row names are quoted).
_V4 = "https://cloud.google.com/tpu/docs/v4"
_V5E = "https://cloud.google.com/tpu/docs/v5e"
_V5P = "https://cloud.google.com/tpu/docs/v5p"
_V6E = "https://cloud.google.com/tpu/docs/v6e"
_RUNTIMES = "https://cloud.google.com/tpu/docs/runtimes"
_TYPES = "https://cloud.google.com/tpu/docs/types-topologies"
_XPK = "https://github.com/AI-Hypercomputer/xpk/blob/main/src/xpk/core/system_characteristics.py"
_RUNTIME_ROW = _RUNTIMES + ' table "PyTorch and JAX" (TPU version -> TPU software version), row '
_ZONES = "https://cloud.google.com/tpu/docs/regions-zones"
_ZONE_ROW = _ZONES + ' table "TPU type ({gen}) | TPU cores | Supported zones", row "All {gen} configurations"'
_TPU7X = "https://docs.cloud.google.com/tpu/docs/tpu7x"
_TPU_MACHINES = "https://docs.cloud.google.com/compute/docs/tpus/tpu-machines"
_TPU_IN_CE = "https://docs.cloud.google.com/tpu/docs/tpus-in-compute-engine"
_TPU_MIGS = "https://docs.cloud.google.com/tpu/docs/tpus-and-migs"
_CONSUME_RESERVATION = "https://docs.cloud.google.com/tpu/docs/consume-reservation"
_CE_ZONES = "https://docs.cloud.google.com/tpu/docs/regions-zones"
_IRONWOOD_GKE = "https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood"
_XPK_GCE = f"{_XPK} (field gce_machine_type of get_tpu_system_characteristics_map; chips_per_vm)"
_CE_VERSIONS = (
    f'{_TPU_MACHINES} "Compute Engine supports the following TPU versions: TPU7x, TPU v6e, TPU v5p"; '
    f'{_TPU_MIGS}: MIGs "for TPU versions v5p, v6e, and TPU7x"'
)
_NOT_ON_CE = f"none: {_CE_VERSIONS} (this generation is not among them)"
_QR_AND_CE = f"queued-resource: {_ZONES} lists the generation for the Cloud TPU API; compute-engine: {_CE_VERSIONS}"
_QR_ONLY = f"queued-resource: {_ZONES} lists the generation for the Cloud TPU API; not compute-engine: {_CE_VERSIONS}"
#: [Google] "About TPUs in GKE": the multi-host TPU slice node pools of v4, v5e, v5p, v6e and TPU7x
#: (docs/gke.md section 2, with their machine types and node labels).
_TPUS_IN_GKE = "https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpus"
_ON_GKE = f"; gke: {_TPUS_IN_GKE} (multi-host TPU slice node pools of this generation; docs/gke.md section 2)"
_CE_ZONE_ROW = f"{_CE_ZONES} North America table (as docs/compute-engine.md section 1 reads it): "
#: The Cloud TPU Multislice overview: Multislice concepts, limits and the DCN arithmetic.
MULTISLICE_OVERVIEW = "https://cloud.google.com/tpu/docs/multislice-introduction"
_OVERVIEW = f"Cloud TPU Multislice overview ({MULTISLICE_OVERVIEW})"

_GiB = 2**30
_GB = 10**9


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            name="v4",
            type_prefix="v4",
            backends=(QUEUED_RESOURCE, GKE),
            tensorcores_per_chip=2,
            suffix_counts="tensorcores",
            sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 4096),
            default_runtime_version="tpu-ubuntu2204-base",
            peak_bf16_flops_per_chip=275e12,
            hbm_bytes_per_chip=32 * _GiB,
            dcn_bits_per_second_per_host=50e9,
            supports_multislice=True,
            chips_per_physical_host=4,
            max_single_vm_chips=4,
            multi_host_chips_per_vm=4,
            zones=("us-central2-b",),
            topologies=(
                "2x2x1",
                "2x2x2",
                "2x2x4",
                "2x4x4",
                "4x4x4",
                "4x4x8",
                "4x8x8",
                "8x8x8",
                "8x8x12",
                "8x8x16",
                "8x16x16",
            ),
            sources={
                "topologies": f"{_XPK} (v4 default_topologies: the topology each v4-N maps to); "
                f'{_TYPES} "v4-128 specifies ... 128 TensorCores" and its example "2x2x4 (16 chips)", '
                'and the v4 page\'s torus examples "4x4x8, 4x8x8 or 12x12x24". PROXY: the v4 configuration '
                f"table of {_V4} could not be read in the stored copy",
                "backends": _QR_ONLY + _ON_GKE,
                "compute_engine_zones": _NOT_ON_CE,
                "compute_engine_machine_types": f"{_NOT_ON_CE}; ct4p-hightpu-4t is a GKE machine type ({_XPK})",
                "tensorcores_per_chip": f'{_V4} "Each TPU v4 chip contains two TensorCores"',
                "suffix_counts": f'{_TYPES} "v4-128 specifies a configuration with v4 TPUs '
                f'and 128 TensorCores"; 2 TensorCores per chip, so v4-8 = 4 chips ({_OVERVIEW})',
                "sizes": f"{_XPK} (v4 topologies 2x2x1 .. 8x16x16 -> v4-8 .. v4-4096). PROXY: "
                f"the v4 configuration table of {_V4} could not be read in the stored copy; "
                f'{_TYPES} only states the rule "AxBxC where A<=B<=C and A,B,C are all <=4 or '
                'all integer multiples of 4"',
                "chips_per_host": f"{_OVERVIEW}: 4 chips per host (v4-8 = one VM, v4-16 = 8 "
                f"chips); {_XPK} (chips_per_vm 4, machine type ct4p-hightpu-4t)",
                "default_runtime_version": _RUNTIME_ROW + '"v4 and older | tpu-ubuntu2204-base"',
                "peak_bf16_flops_per_chip": f'{_V4} key specifications row "Peak compute per '
                f'chip | 275 teraflops (bf16 or int8)"; {_OVERVIEW} (275e12 FLOP/s)',
                "hbm_bytes_per_chip": f'{_V4} row "HBM2 capacity and bandwidth | 32 GiB, '
                '1200 GBps" (GiB: 32 * 2**30 bytes)',
                "dcn_bits_per_second_per_host": f"{_OVERVIEW}: v4, 4 chips per host, the host's "
                "DCN bandwidth 50 Gbps (its arithmetic 4 x 275e12 / 50e9 = 22,000 FLOP/bit); not in "
                "the v4 page's specification table",
                "chips_per_physical_host": f"{_OVERVIEW}: 4 chips per host",
                "supports_multislice": f"{_OVERVIEW}: only TPU v4 and later support Multislice",
                "zones": _ZONE_ROW.format(gen="v4") + ": us-central2-b (the only v4 zone listed)",
                "runtime_versions": _RUNTIME_ROW + '"v4 and older | tpu-ubuntu2204-base"',
            },
        ),
        Generation(
            name="v5e",
            type_prefix="v5litepod",
            backends=(QUEUED_RESOURCE, GKE),
            tensorcores_per_chip=1,
            suffix_counts="chips",
            sizes=(1, 4, 8, 16, 32, 64, 128, 256),
            default_runtime_version="v2-alpha-tpuv5-lite",
            peak_bf16_flops_per_chip=197e12,
            hbm_bytes_per_chip=16 * _GB,
            dcn_bits_per_second_per_host=2 * 100e9,
            supports_multislice=True,
            chips_per_physical_host=8,
            max_single_vm_chips=8,
            multi_host_chips_per_vm=4,
            zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
            topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
            sources={
                "topologies": f'{_V5E} 2D slice shapes table "Topology | Number of TPU chips | Number of '
                'hosts": 1x1=1, 2x2=4, 2x4=8, 4x4=16, 4x8=32, 8x8=64, 8x16=128, 16x16=256',
                "backends": _QR_ONLY + _ON_GKE,
                "compute_engine_zones": _NOT_ON_CE,
                "compute_engine_machine_types": f"{_NOT_ON_CE}; ct5lp-hightpu-1t/-4t/-8t are the GKE machine "
                f'types of {_V5E} ("Machine type (GKE API)")',
                "tensorcores_per_chip": f'{_V5E} "Each v5e chip contains one TensorCore"',
                "suffix_counts": f'{_V5E} "The value you specify for AcceleratorType is a '
                'string with the format: v$VERSION_NUMBER-$CHIP_COUNT"',
                "sizes": f'{_V5E} 2D slice shapes table "Topology | Number of TPU chips | Number '
                'of hosts": 1x1=1, 2x2=4, 2x4=8, 4x4=16, 4x8=32, 8x8=64, 8x16=128, 16x16=256; '
                "types v5litepod-1/-4/-8 (serving table), training up to 256 chips",
                "chips_per_host": f'{_V5E} "Each TPU VM in a v5e TPU slice contains 1, 4 or 8 '
                'chips"; serving table v5litepod-1/-4/-8 -> ct5lp-hightpu-1t/-4t/-8t (one VM); '
                f"multi-host 4-chip VMs (ct5lp-hightpu-4t) from {_XPK} (v5litepod-16 = 4 VMs), "
                "matching the v6e table. PROXY for v5litepod-16 and larger: not stated on the "
                "v5e page excerpts read",
                "default_runtime_version": _RUNTIME_ROW + '"v5e | v2-alpha-tpuv5-lite"',
                "peak_bf16_flops_per_chip": f'{_V5E} row "Peak compute per chip (bf16) | 197 TFLOPs"',
                "hbm_bytes_per_chip": f'{_V5E} row "HBM capacity per chip | 16 GB" (older '
                'revision "HBM2 capacity and bandwidth | 16 GB, 819 GBps"); GB as printed: '
                "16 * 10**9 bytes",
                "dcn_bits_per_second_per_host": f'{_V5E} row "Per-host NIC configuration | 2 x '
                '100 Gbps NIC" with "Chips per host | 8"; consistent with "Data center network '
                'bandwidth per Pod | 6.4 Tbps" over 256 chips / 8 = 32 hosts. NIC capacity '
                "used as the DCN figure",
                "chips_per_physical_host": f'{_V5E} row "Chips per host | 8"',
                "supports_multislice": f"{_OVERVIEW}: only TPU v4 and later support Multislice",
                "zones": _ZONE_ROW.format(gen="v5e")
                + ": us-central1-a, us-south1-a, us-west1-c, us-west4-a (North America table)",
                "runtime_versions": _RUNTIME_ROW + '"v5e | v2-alpha-tpuv5-lite"',
            },
        ),
        Generation(
            name="v5p",
            type_prefix="v5p",
            tensorcores_per_chip=2,
            suffix_counts="tensorcores",
            sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288),
            default_runtime_version="v2-alpha-tpuv5",
            peak_bf16_flops_per_chip=459e12,
            hbm_bytes_per_chip=95 * _GiB,
            dcn_bits_per_second_per_host=4 * 50e9,
            supports_multislice=True,
            chips_per_physical_host=4,
            max_single_vm_chips=4,
            multi_host_chips_per_vm=4,
            zones=("us-central1-a", "us-east5-a"),
            topologies=(
                "2x2x1",
                "2x2x2",
                "2x2x4",
                "2x4x4",
                "4x4x4",
                "4x4x8",
                "4x8x8",
                "8x8x8",
                "8x8x16",
                "8x16x16",
                "16x16x16",
                "16x16x24",
            ),
            backends=(QUEUED_RESOURCE, COMPUTE_ENGINE, GKE),
            compute_engine_zones=("us-central1-a", "us-east5-a"),
            compute_engine_machine_types={4: "ct5p-hightpu-4t"},
            sources={
                "topologies": f'{_V5P} configurations table "Topology | Cores | Chips | Hosts": 2x2x1 | 8, '
                "2x2x2 | 16, 2x4x4 | 64, 4x4x4 | 128, 4x4x8 | 256, 4x8x8 | 512, 8x8x8 | 1024, 8x8x16 | 2048, "
                "8x16x16 | 4096, 16x16x16 | 8192, 16x16x24 | 12288; v5p-32 (16 chips, not in that table): "
                f"2x2x4, from {_XPK} (v5p default_topologies) and {_TYPES} (2x2x4 = 16 chips)",
                "backends": _QR_AND_CE + _ON_GKE,
                "compute_engine_zones": _CE_ZONE_ROW + "v5p: us-central1-a, us-east5-a",
                "compute_engine_machine_types": f'ct5p-hightpu-4t (4-chip VM): {_XPK_GCE}; {_V5P} rows "(4-chip VM)"',
                "tensorcores_per_chip": f'{_V5P} row "Number of TensorCores per chip | 2"; '
                '"v5p-32 specifies a v5p TPU slice with 32 TensorCores (16 chips)"',
                "suffix_counts": f'{_V5P} "--accelerator-type is a formatted string v$VERSION_NUMBERp-$CORES_COUNT"',
                "sizes": f'{_V5P} configurations table column "Cores" (2x2x1=8, 2x2x2=16, '
                "2x4x4=64, 4x4x4=128, 4x4x8=256, 4x8x8=512, 8x8x8=1024, 8x8x16=2048, "
                '8x16x16=4096, 16x16x16=8192, 16x16x24=12288) plus the listed types "v5p-8, '
                'v5p-16, v5p-32, v5p-64, v5p-128, v5p-256, v5p-512, v5p-1024 ... v5p-12288" '
                "(the docs call the table 'most common' shapes: other sizes exist)",
                "chips_per_host": f'{_V5P} table "Topology | Cores | Chips | Hosts": hosts = '
                'chips / 4 on every row (2x2x1: 4 chips, 1 host); rows "Number of vCPUs (4-chip '
                'VM)", machine type ct5p-hightpu-4t',
                "default_runtime_version": _RUNTIME_ROW + '"v5p | v2-alpha-tpuv5"',
                "peak_bf16_flops_per_chip": f'{_V5P} row "Peak compute per chip (BF16) (TFLOPs) | 459"',
                "hbm_bytes_per_chip": f'{_V5P} row "HBM capacity per chip (GiB) | 95" (current '
                'revision: 95 * 2**30 bytes; an older revision printed "HBM2e capacity and '
                'bandwidth | 95GB, 2765 GBps")',
                "dcn_bits_per_second_per_host": f'{_V5P} row "Data center network (DCN) '
                'bandwidth per chip (Gbps) | 50" times 4 chips per host (4-chip VM); the docs '
                "give it per chip, the per-host value is derived",
                "chips_per_physical_host": f'{_V5P} rows "(4-chip VM)"; hosts = chips / 4',
                "supports_multislice": f"{_OVERVIEW}: only TPU v4 and later support Multislice",
                "zones": _ZONE_ROW.format(gen="v5p") + ": us-central1-a, us-east5-a (North America table)",
                "runtime_versions": _RUNTIME_ROW + '"v5p | v2-alpha-tpuv5"',
            },
        ),
        Generation(
            name="v6e",
            type_prefix="v6e",
            tensorcores_per_chip=1,
            suffix_counts="chips",
            sizes=(1, 4, 8, 16, 32, 64, 128, 256),
            default_runtime_version="v2-alpha-tpuv6e",
            peak_bf16_flops_per_chip=918e12,
            hbm_bytes_per_chip=32 * _GB,
            dcn_bits_per_second_per_host=4 * 200e9,
            supports_multislice=True,
            chips_per_physical_host=8,
            max_single_vm_chips=8,
            multi_host_chips_per_vm=4,
            zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
            topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
            backends=(QUEUED_RESOURCE, COMPUTE_ENGINE, GKE),
            compute_engine_zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"),
            compute_engine_machine_types={1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
            sources={
                "topologies": f'{_V6E} supported configurations table "Topology | TPU chips": 1x1=1, 2x2=4, '
                "2x4=8, 4x4=16, 4x8=32, 8x8=64, 8x16=128, 16x16=256",
                "backends": _QR_AND_CE + _ON_GKE,
                "compute_engine_zones": _CE_ZONE_ROW + "v6e: us-central1-b, us-east1-d, us-east5-a, us-east5-b",
                "compute_engine_machine_types": f"ct6e-standard-1t (1x1), ct6e-standard-4t (2x2 and every "
                f"multi-host slice): {_XPK_GCE}; ct6e-standard-8t (2x4, one 8-chip VM): {_V6E} supported "
                "configurations table, and the example MACHINE_TYPE of "
                "https://docs.cloud.google.com/tpu/docs/consume-reservation-compute",
                "tensorcores_per_chip": f'{_V6E} "Each v6e chip contains one TensorCore"',
                "suffix_counts": f'{_V6E} supported configurations table "Accelerator type (TPU '
                'API)": 1x1 -> v6e-1, 2x2 -> v6e-4, 2x4 -> v6e-8 (suffix = chips)',
                "sizes": f"{_V6E} supported configurations table (1x1=1, 2x2=4, 2x4=8, 4x4=16, "
                '4x8=32, 8x8=64, 8x16=128, 16x16=256 chips); "TPU v6e supports training for up '
                'to 256 v6e chips"',
                "chips_per_host": f'{_V6E} table "Topology | TPU chips | Hosts | VMs": 1x1, 2x2, '
                "2x4 (v6e-8, ct6e-standard-8t) on 1 VM; 4x4 = 16 chips on 4 VMs ... 16x16 = 256 "
                "chips on 64 VMs (ct6e-standard-4t). The 2x4-on-2-VMs row is GKE-only",
                "default_runtime_version": _RUNTIME_ROW + '"Trillium (v6e) | v2-alpha-tpuv6e"',
                "peak_bf16_flops_per_chip": f'{_V6E} row "Peak compute per chip (bf16) | 918 TFLOPs"',
                "hbm_bytes_per_chip": f'{_V6E} row "HBM capacity per chip | 32 GB"; GB as printed: 32 * 10**9 bytes',
                "dcn_bits_per_second_per_host": f'{_V6E} row "Per-host NIC configuration | 4 x '
                '200 Gbps NIC" with "Chips per host | 8"; consistent with "Data center network '
                'bandwidth per Pod | 25.6 Tbps" over 32 hosts. NIC capacity used as the DCN '
                "figure",
                "chips_per_physical_host": f'{_V6E} row "Chips per host | 8"',
                "supports_multislice": f"{_OVERVIEW}: only TPU v4 and later support Multislice",
                "zones": _ZONE_ROW.format(gen="v6e")
                + ": us-central1-b, us-east1-d, us-east5-a, us-east5-b (North America table), "
                "europe-west4-a (Europe table)",
                "runtime_versions": _RUNTIME_ROW + '"Trillium (v6e) | v2-alpha-tpuv6e"',
            },
        ),
        Generation(
            name="tpu7x",
            type_prefix="tpu7x",
            tensorcores_per_chip=2,
            suffix_counts="tensorcores",
            sizes=(2, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 18432),
            default_runtime_version=None,
            peak_bf16_flops_per_chip=2307e12,
            hbm_bytes_per_chip=192 * _GiB,
            dcn_bits_per_second_per_host=4 * 100e9,
            supports_multislice=True,
            chips_per_physical_host=4,
            max_single_vm_chips=4,
            multi_host_chips_per_vm=4,
            zones=(),
            topologies=(
                "1x1x1",
                "2x2x1",
                "2x2x2",
                "2x2x4",
                "2x4x4",
                "4x4x4",
                "4x4x8",
                "4x8x8",
                "8x8x8",
                "8x8x16",
                "8x16x16",
                "16x16x16",
                "16x16x24",
                "16x16x32",
                "16x24x24",
            ),
            backends=(COMPUTE_ENGINE, GKE),
            compute_engine_zones=("us-central1-c", "us-central1-ai1a"),
            compute_engine_machine_types={1: "tpu7x-standard-1t", 4: "tpu7x-standard-4t"},
            sources={
                "tensorcores_per_chip": f'{_TPU7X} "Each TPU7x chip contains two TensorCores and four '
                'SparseCores"; row "Number of TensorCores per chip | ... | 2"',
                "suffix_counts": f"{_XPK} (tpu7x entries: device_type = f'{{prefix}}-{{num_tensorcores}}', "
                "tensorcores_per_chip=2, so tpu7x-8 = 2x2x1 = 4 chips, as v5p's names count). PROXY: no "
                "Google page read names TPU7x accelerator types (Compute Engine takes a machine type and a "
                "workload policy's topology instead); the name is this catalog's key",
                "sizes": f"{_XPK}: tpu7x-standard-1t supports 1x1x1 (tpu7x-2); tpu7x-standard-4t supports "
                "generate_tpu_topologies(max_cubes=144): 2x2x1, 2x2x2, 2x2x4, 2x4x4 and AxBxC multiples of 4 up "
                "to 144 cubes. Listed here: a subset, 1x1x1 and the topologies of xpk's tpu7x default_topologies "
                "that this catalog lists for v5p (2x2x1 ... 16x16x24), plus 16x16x32 and 16x24x24 = "
                f'9216 chips, the Pod ({_TPU7X} row "Number of chips per pod | ... | 9216"); xpk has more shapes '
                "(4x4x12 and others), not listed",
                "topologies": f"{_XPK} (the topology each tpu7x-N maps to: tpu7x default_topologies); "
                f'{_TPU7X} row "Number of chips per pod | 9216" bounds them',
                "chips_per_host": f'{_IRONWOOD_GKE} "Each Ironwood (TPU7x) virtual machine (VM) contains '
                f'four chips and two NICs"; {_TPU7X} rows "(4-chip VM)"; {_XPK} (chips_per_vm 1 for 1x1x1, '
                "else 4)",
                "default_runtime_version": f"none: the Cloud TPU API does not offer TPU7x ({_CONSUME_RESERVATION} "
                '"The Cloud TPU API is not supported on TPU7x and later TPU versions"); Compute Engine VMs '
                "boot an image, not a TPU software version",
                "peak_bf16_flops_per_chip": f'{_TPU7X} row "Peak compute per chip (BF16) (TFLOPs) | ... | 2307"',
                "hbm_bytes_per_chip": f'{_TPU7X} row "HBM capacity per chip (GiB) | ... | 192" (192 * 2**30 bytes)',
                "dcn_bits_per_second_per_host": f'{_TPU7X} row "Data center network (DCN) bandwidth per chip '
                '(Gbps) | ... | 100" times 4 chips per VM; the docs give it per chip, the per-host value is '
                "derived (as for v5p)",
                "chips_per_physical_host": f'{_TPU7X} rows "(4-chip VM)"; {_IRONWOOD_GKE} "four chips" per VM',
                "supports_multislice": f"{_OVERVIEW}: only TPU v4 and later support Multislice; on Compute "
                "Engine each slice is its own MIG (docs/compute-engine.md section 2)",
                "zones": f"none: the Cloud TPU API does not offer TPU7x ({_CONSUME_RESERVATION}; {_TPU_IN_CE}: "
                'new generations "starting with TPU7x (Ironwood), are supported only through Compute Engine or '
                'GKE")',
                "runtime_versions": f"none: the Cloud TPU API does not offer TPU7x ({_CONSUME_RESERVATION})",
                "backends": f'compute-engine: {_CE_VERSIONS}; {_CONSUME_RESERVATION} "The Cloud TPU API is '
                'not supported on TPU7x and later TPU versions"' + _ON_GKE,
                "compute_engine_zones": _CE_ZONE_ROW + "TPU7x: us-central1-c, us-central1-ai1a",
                "compute_engine_machine_types": f"tpu7x-standard-1t (1x1x1) and tpu7x-standard-4t: {_XPK_GCE}",
            },
        ),
    )
}
