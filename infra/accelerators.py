"""Cloud TPU catalog: generations, accelerator types, hosts, runtime, peak FLOP/s, HBM, DCN.

An accelerator type is ``f"{type_prefix}-{N}"``. What ``N`` counts depends on the generation:

* **v4 and v5p count TensorCores.** "v4-128 specifies a configuration with v4 TPUs and 128
  TensorCores" (https://cloud.google.com/tpu/docs/types-topologies); for v5p
  "--accelerator-type is a formatted string v$VERSION_NUMBERp-$CORES_COUNT. For example,
  v5p-32 specifies a v5p TPU slice with 32 TensorCores (16 chips)"
  (https://cloud.google.com/tpu/docs/v5p). Both have 2 TensorCores per chip, so
  chips = N / 2 (v4-8 = 4 chips, v4-16 = 8 chips).
* **v5e (``v5litepod-N``) and v6e count chips.** "The value you specify for AcceleratorType is
  a string with the format: v$VERSION_NUMBER-$CHIP_COUNT" (https://cloud.google.com/tpu/docs/v5e);
  the v6e table lists v6e-1 for 1x1, v6e-4 for 2x2, v6e-8 for 2x4
  (https://cloud.google.com/tpu/docs/v6e). Both have 1 TensorCore per chip, so chips = N.

Hosts: every number here about "hosts" on an :class:`AcceleratorType` counts **TPU VMs**
(workers, one process each), which is what a queued resource creates and what JAX sees. The
docs' v5e/v6e "Hosts" column counts 8-chip physical machines instead (4x4 = 2 hosts but 4 VMs
in the v6e table), so it is not used for that. Chips per VM, per the docs' tables:

* v4, v5p: 4 chips per VM for every slice (v5p table: 2x2x1 = 4 chips, 1 host; 2x2x2 = 8 chips,
  2 hosts; "4-chip VM"; v4: 4 chips per host, so v4-8 = one VM and v4-16 = two, as the Cloud
  TPU Multislice overview https://cloud.google.com/tpu/docs/multislice-introduction uses them).
* v5e, v6e: slices of up to 8 chips are one VM holding all chips (v6e-1/-4/-8 are 1 VM;
  v5litepod-1/-4/-8 map to machine types ct5lp-hightpu-1t/-4t/-8t); larger (multi-host) slices
  use 4-chip VMs (v6e table: 4x4 = 16 chips on 4 VMs ... 16x16 = 256 chips on 64 VMs,
  ct6e-standard-4t). The v5e page says only "each TPU VM in a v5e TPU slice contains 1, 4 or 8
  chips"; 4-chip VMs for v5litepod-16 and larger (ct5lp-hightpu-4t) is taken from Google's
  AI-Hypercomputer/xpk ``system_characteristics.py`` and matches v6e.

Where a generation runs: ``Generation.zones`` lists the zones of the "TPU regions and zones"
page (https://cloud.google.com/tpu/docs/regions-zones) that could be read in the stored copy
of that page (its North America tables, and v6e's europe-west4-a); the other regions' tables
of that page were cut off in that copy and are *not* listed here, unverified. Cloud TPU opens
new zones over time: a stack may name an unlisted zone with ``multislice:allowUnlisted:
[zone]`` (``pulumi preview`` then warns instead of failing), and the zone belongs in this
catalog once the page lists it. ``Generation.runtime_versions`` are the TPU software versions
the "PyTorch and JAX" table of https://cloud.google.com/tpu/docs/runtimes names for the
generation (one each); ``multislice:allowUnlisted: [runtimeVersion]`` admits another one.

Every number carries its source in ``Generation.sources``. Pure data and arithmetic: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "GENERATIONS",
    "MAX_SLICES",
    "SOFTWARE_CHECKED",
    "AcceleratorType",
    "Generation",
    "UnknownAcceleratorType",
    "accelerator_types",
    "parse_accelerator_type",
]

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
#: The Cloud TPU Multislice overview: Multislice concepts, limits and the DCN arithmetic.
MULTISLICE_OVERVIEW = "https://cloud.google.com/tpu/docs/multislice-introduction"
_OVERVIEW = f"Cloud TPU Multislice overview ({MULTISLICE_OVERVIEW})"

_GiB = 2**30
_GB = 10**9

MAX_SLICES: int = 256
"""Most slices (nodes) one Multislice queued resource may hold: up to 256 slices per queued
resource. Source: the Cloud TPU Multislice overview (:data:`MULTISLICE_OVERVIEW`)."""

SOFTWARE_CHECKED: dict[str, str] = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
"""The pins of ``uv.lock`` whose support for every generation of :data:`GENERATIONS` was checked
(docs/cloud-tpu.md, "JAX and libtpu on each generation": jax's own device table and release
CI at tag ``jax-v0.10.2``, and the libtpu pin of its ``tpu`` extra). A test fails when
``uv.lock`` pins other versions, so a bump redoes that check instead of carrying it over."""


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the facts the environment model needs about it.

    Units: FLOP/s, bytes, bits per second. ``sources`` maps each field name to the public
    document (URL + table row) it came from, and says when a value is a proxy.

    Attributes:
        name: generation name used in configs: "v4", "v5e", "v5p", "v6e".
        type_prefix: accelerator-type prefix: "v4", "v5litepod", "v5p", "v6e".
        tensorcores_per_chip: TensorCores on one chip (2 for v4/v5p, 1 for v5e/v6e).
        suffix_counts: what N in ``f"{type_prefix}-{N}"`` counts: "tensorcores" or "chips".
        sizes: every valid N, ascending.
        default_runtime_version: TPU software (runtime) version the docs recommend for JAX.
        peak_bf16_flops_per_chip: peak dense bf16 compute of one chip, FLOP/s.
        hbm_bytes_per_chip: HBM capacity of one chip in bytes, converted with the unit the
            doc prints (GiB -> 2**30, GB -> 10**9); ``sources`` says which.
        dcn_bits_per_second_per_host: data-center-network bandwidth of one *physical* TPU
            host of ``chips_per_physical_host`` chips, bits/s, as the docs state it. This is
            not per TPU VM: a multi-host v5e/v6e VM holds 4 of a host's 8 chips. For a VM use
            ``AcceleratorType.dcn_bits_per_second_per_host`` or
            ``dcn_bits_per_second_per_chip * chips_per_host``.
        supports_multislice: whether Multislice is supported (v4 and later).
        sources: field name -> source string.
        chips_per_physical_host: chips on the physical machine the DCN figure refers to.
        max_single_vm_chips: largest slice (in chips) served by one VM holding all its chips.
        multi_host_chips_per_vm: chips per VM in slices larger than ``max_single_vm_chips``.
        zones: zones that offer the generation (see the module docstring for what is listed).
        runtime_versions: TPU software versions known to work for JAX on the generation;
            ``default_runtime_version`` is always among them (added first when missing).
    """

    name: str
    type_prefix: str
    tensorcores_per_chip: int
    suffix_counts: str
    sizes: tuple[int, ...]
    default_runtime_version: str
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_chip: int
    dcn_bits_per_second_per_host: float
    supports_multislice: bool
    sources: dict[str, str] = field(compare=False, hash=False, repr=False)
    chips_per_physical_host: int = 4
    max_single_vm_chips: int = 4
    multi_host_chips_per_vm: int = 4
    zones: tuple[str, ...] = ()
    runtime_versions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.default_runtime_version not in self.runtime_versions:  # the default is always known
            object.__setattr__(self, "runtime_versions", (self.default_runtime_version, *self.runtime_versions))
        if self.suffix_counts not in ("tensorcores", "chips"):
            raise ValueError(f"suffix_counts must be 'tensorcores' or 'chips', not {self.suffix_counts!r}")
        if list(self.sizes) != sorted(set(self.sizes)) or not self.sizes:
            raise ValueError(f"{self.name}: sizes must be non-empty, unique and ascending")
        for size in self.sizes:
            # Raises if a listed size does not map to a whole number of chips and VMs.
            self.chips_per_host(self.chips_for_size(size))

    # --- naming arithmetic -------------------------------------------------------------

    def chips_for_size(self, size: int) -> int:
        """Chips in a slice of type ``f"{type_prefix}-{size}"`` (size need not be listed).

        Raises:
            ValueError: when a TensorCore count is not a whole number of chips.
        """
        if self.suffix_counts == "chips":
            return size
        chips, rest = divmod(size, self.tensorcores_per_chip)
        if rest:
            raise ValueError(
                f"{self.type_prefix}-{size}: the suffix counts TensorCores and must be a "
                f"multiple of {self.tensorcores_per_chip} (TensorCores per chip)"
            )
        return chips

    def type_name(self, size: int) -> str:
        """Accelerator-type name for suffix ``size``, e.g. ``type_name(16) == "v4-16"``."""
        return f"{self.type_prefix}-{size}"

    @property
    def chip_counts(self) -> tuple[int, ...]:
        """Chips per slice of every listed size, ascending."""
        return tuple(self.chips_for_size(s) for s in self.sizes)

    def chips_per_host(self, chips: int) -> int:
        """Chips attached to each TPU VM (worker) of a slice with ``chips`` chips.

        A slice of at most ``max_single_vm_chips`` chips is one VM holding all of them
        (v4-8/v5p-8: 4 chips; v5litepod-8/v6e-8: 8 chips; v6e-1: 1 chip); larger slices use
        ``multi_host_chips_per_vm``-chip VMs (4 for every generation here). Sources: the
        "chips_per_host" entry of ``sources``.

        Raises:
            ValueError: ``chips`` is not a positive whole number of VMs for this generation.
        """
        if not isinstance(chips, int) or isinstance(chips, bool) or chips <= 0:
            raise ValueError(f"{self.name}: chips must be a positive int, not {chips!r}")
        if chips <= self.max_single_vm_chips:
            return chips
        if chips % self.multi_host_chips_per_vm:
            raise ValueError(
                f"{self.name}: a {chips}-chip slice does not split into {self.multi_host_chips_per_vm}-chip VMs"
            )
        return self.multi_host_chips_per_vm

    # --- derived hardware figures -----------------------------------------------------

    @property
    def dcn_bits_per_second_per_chip(self) -> float:
        """DCN bandwidth per chip, bits/s: the host figure shared evenly by its chips."""
        return self.dcn_bits_per_second_per_host / self.chips_per_physical_host

    @property
    def flops_per_dcn_bit(self) -> float:
        """Hardware arithmetic intensity over DCN, FLOP per bit: peak bf16 FLOP/s per chip
        divided by DCN bits/s per chip. v4: 275e12 / (50e9 / 4) = 22,000, the figure of the Cloud
        TPU Multislice overview (:data:`MULTISLICE_OVERVIEW`)."""
        return self.peak_bf16_flops_per_chip / self.dcn_bits_per_second_per_chip

    def allowed_compact(self) -> str:
        """All valid type names of this generation, compactly: ``"v4-{8,16,...,4096}"``."""
        return f"{self.type_prefix}-{{{','.join(str(s) for s in self.sizes)}}}"


@dataclass(frozen=True)
class AcceleratorType:
    """One valid accelerator type (slice shape by count) and its arithmetic.

    Attributes:
        name: accelerator-type string as the TPU API takes it, e.g. "v4-16".
        generation: the :class:`Generation` it belongs to.
        chips: TPU chips per slice.
        tensorcores: TensorCores per slice (= chips * generation.tensorcores_per_chip).
        hosts: TPU VMs (workers, one JAX process each) per slice.
        chips_per_host: chips attached to each VM (= chips / hosts).
    """

    name: str
    generation: Generation
    chips: int
    tensorcores: int
    hosts: int
    chips_per_host: int

    def __post_init__(self) -> None:
        if self.tensorcores != self.chips * self.generation.tensorcores_per_chip:
            raise ValueError(f"{self.name}: tensorcores != chips * tensorcores_per_chip")
        if self.hosts * self.chips_per_host != self.chips:
            raise ValueError(f"{self.name}: hosts * chips_per_host != chips")

    @property
    def peak_bf16_flops_per_slice(self) -> float:
        """Peak bf16 compute of the whole slice, FLOP/s (chips * peak per chip)."""
        return self.chips * self.generation.peak_bf16_flops_per_chip

    @property
    def hbm_bytes_per_slice(self) -> int:
        """HBM of the whole slice in bytes (chips * HBM per chip)."""
        return self.chips * self.generation.hbm_bytes_per_chip

    @property
    def is_multi_host(self) -> bool:
        """True when the slice spans more than one TPU VM."""
        return self.hosts > 1

    @property
    def dcn_bits_per_second_per_host(self) -> float:
        """DCN bandwidth available to one VM of this slice, bits/s, assuming the physical
        host's bandwidth is shared evenly by its chips (exact for v4/v5p, whose VM is the
        whole 4-chip host; an even-share estimate for 4-chip v5e/v6e VMs)."""
        return self.generation.dcn_bits_per_second_per_chip * self.chips_per_host


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            name="v4",
            type_prefix="v4",
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
            sources={
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
            sources={
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
            sources={
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
            sources={
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
    )
}

_BY_PREFIX: dict[str, Generation] = {g.type_prefix: g for g in GENERATIONS.values()}
_NAME_RE = re.compile(r"^(?P<prefix>[a-z][a-z0-9]*)-(?P<size>[1-9][0-9]*)$")


def _allowed_all() -> str:
    return ", ".join(g.allowed_compact() for g in GENERATIONS.values())


class UnknownAcceleratorType(ValueError):
    """An accelerator-type string that is not in the catalog.

    The message names the value and lists what is allowed, per generation, e.g.
    ``v4-{8,16,32,...}``. Attributes: ``name`` (the rejected value) and ``allowed`` (the
    compact listing shown).
    """

    def __init__(self, name: object, reason: str, allowed: str) -> None:
        self.name = name
        self.allowed = allowed
        super().__init__(f"unknown accelerator type {name!r}: {reason}; allowed: {allowed}")


def _hint(name: str) -> str:
    """A short 'did you mean' for common near-misses, or ''."""
    cleaned = name.strip().lower()
    if cleaned != name and cleaned in _ALL_NAMES:
        return f" (did you mean {cleaned!r}?)"
    m = _NAME_RE.match(cleaned)
    if m and m["prefix"] == "v5e":
        return f" (v5e types are named v5litepod-N, e.g. 'v5litepod-{m['size']}')"
    return ""


def parse_accelerator_type(name: object) -> AcceleratorType:
    """Parse and validate an accelerator-type string such as "v4-16" or "v5litepod-8".

    Returns the slice's chips, TensorCores, TPU VMs (hosts) and chips per VM. Examples:
    v4-8 -> 4 chips on 1 VM; v4-16 -> 8 chips on 2 VMs; v5p-8 -> 4 chips on 1 VM;
    v5litepod-8 -> 8 chips on 1 VM; v6e-16 -> 16 chips on 4 VMs.

    Raises:
        UnknownAcceleratorType: the string is malformed, the generation prefix is unknown, or
            the size is not listed for the generation; the message lists the allowed values.
    """
    if not isinstance(name, str):
        raise UnknownAcceleratorType(name, "expected a string like 'v4-8'", _allowed_all())
    m = _NAME_RE.match(name)
    if m is None:
        raise UnknownAcceleratorType(name, "expected '<prefix>-<N>', e.g. 'v4-8'" + _hint(name), _allowed_all())
    gen = _BY_PREFIX.get(m["prefix"])
    if gen is None:
        known = ", ".join(repr(p) for p in _BY_PREFIX)
        raise UnknownAcceleratorType(
            name,
            f"unknown generation prefix {m['prefix']!r} (known: {known})" + _hint(name),
            _allowed_all(),
        )
    size = int(m["size"])
    if size not in gen.sizes:
        smallest = gen.sizes[0]
        counts = (
            f"TensorCores, {gen.tensorcores_per_chip} per chip: "
            f"{gen.type_name(smallest)} = {gen.chips_for_size(smallest)} chips"
            if gen.suffix_counts == "tensorcores"
            else "chips"
        )
        raise UnknownAcceleratorType(
            name,
            f"{size} is not a listed {gen.name} size (the suffix counts {counts})",
            gen.allowed_compact(),
        )
    chips = gen.chips_for_size(size)
    per_host = gen.chips_per_host(chips)
    return AcceleratorType(
        name=name,
        generation=gen,
        chips=chips,
        tensorcores=chips * gen.tensorcores_per_chip,
        hosts=chips // per_host,
        chips_per_host=per_host,
    )


def accelerator_types() -> list[str]:
    """Every valid accelerator-type name, in catalog order (generation, then size)."""
    return list(_ALL_NAMES)


_ALL_NAMES: tuple[str, ...] = tuple(g.type_name(s) for g in GENERATIONS.values() for s in g.sizes)
