"""The catalog's topologies, Compute Engine machine types, backends and the TPU7x generation.

Expected values are written out from the public tables (sources in comments), not read back
from the catalog.
"""

from __future__ import annotations

import dataclasses
import re
from functools import reduce
from operator import mul

import pytest

from infra.accelerators import (
    GENERATIONS,
    AcceleratorType,
    Generation,
    accelerator_types,
    parse_accelerator_type,
)
from infra.backends.registry import NAMES, check_catalog
from infra.config import schema


def _chips(topology: str) -> int:
    dims = [int(d) for d in topology.split("x")]
    return reduce(mul, dims, 1)


@pytest.mark.parametrize("name", accelerator_types())
def test_every_listed_size_has_a_topology_of_its_chips(name: str):
    acc = parse_accelerator_type(name)
    dims = acc.topology.split("x")
    # v4, v5p, TPU7x tables write 3-D topologies; v5e and v6e 2-D ones.
    assert len(dims) == (3 if acc.generation.name in ("v4", "v5p", "tpu7x") else 2), name
    assert all(re.fullmatch(r"[1-9][0-9]*", d) for d in dims), name
    assert _chips(acc.topology) == acc.chips, name
    # The docs write AxBxC with A <= B <= C (types-topologies, for v4), except the one-VM 2x2x1
    # that the v5p table (and xpk) write so.
    assert [int(d) for d in dims] == sorted(int(d) for d in dims) or acc.topology == "2x2x1", name


@pytest.mark.parametrize(
    ("name", "topology", "chips", "vms"),
    [
        # https://cloud.google.com/tpu/docs/v5p table "Topology | Cores | Chips | Hosts".
        ("v5p-8", "2x2x1", 4, 1),
        ("v5p-16", "2x2x2", 8, 2),
        ("v5p-64", "2x4x4", 32, 8),
        ("v5p-128", "4x4x4", 64, 16),
        ("v5p-1024", "8x8x8", 512, 128),
        ("v5p-12288", "16x16x24", 6144, 1536),
        # Not in that table; xpk's v5p default topology, and types-topologies: 2x2x4 = 16 chips.
        ("v5p-32", "2x2x4", 16, 4),
        # https://cloud.google.com/tpu/docs/v6e supported configurations table.
        ("v6e-1", "1x1", 1, 1),
        ("v6e-4", "2x2", 4, 1),
        ("v6e-8", "2x4", 8, 1),
        ("v6e-16", "4x4", 16, 4),
        ("v6e-256", "16x16", 256, 64),
        # https://cloud.google.com/tpu/docs/v5e 2D slice shapes table.
        ("v5litepod-1", "1x1", 1, 1),
        ("v5litepod-8", "2x4", 8, 1),
        ("v5litepod-128", "8x16", 128, 32),
        # v4: types-topologies "2x2x4 (16 chips ...)"; xpk's v4 default topologies.
        ("v4-8", "2x2x1", 4, 1),
        ("v4-32", "2x2x4", 16, 4),
        ("v4-1536", "8x8x12", 768, 192),
        # TPU7x: xpk tpu7x entries (1x1x1 on tpu7x-standard-1t; 4x4x4 = "a 16-node group of TPU VMs"
        # on GKE's dynamic slicing page); 16x24x24 = 9216 chips, the TPU7x Pod.
        ("tpu7x-2", "1x1x1", 1, 1),
        ("tpu7x-8", "2x2x1", 4, 1),
        ("tpu7x-128", "4x4x4", 64, 16),
        ("tpu7x-18432", "16x24x24", 9216, 2304),
    ],
)
def test_documented_topologies(name: str, topology: str, chips: int, vms: int):
    acc = parse_accelerator_type(name)
    assert (acc.topology, acc.chips, acc.hosts) == (topology, chips, vms)


@pytest.mark.parametrize(
    ("name", "machine_type"),
    [
        # docs/compute-engine.md section 1 (xpk gce_machine_type; v6e table for ct6e-standard-8t).
        ("v5p-8", "ct5p-hightpu-4t"),
        ("v5p-4096", "ct5p-hightpu-4t"),
        ("v6e-1", "ct6e-standard-1t"),
        ("v6e-4", "ct6e-standard-4t"),
        ("v6e-8", "ct6e-standard-8t"),
        ("v6e-16", "ct6e-standard-4t"),
        ("v6e-256", "ct6e-standard-4t"),
        ("tpu7x-2", "tpu7x-standard-1t"),
        ("tpu7x-8", "tpu7x-standard-4t"),
        ("tpu7x-4096", "tpu7x-standard-4t"),
        # Compute Engine does not offer v4 or v5e.
        ("v4-8", None),
        ("v4-4096", None),
        ("v5litepod-8", None),
        ("v5litepod-16", None),
    ],
)
def test_machine_types(name: str, machine_type: str | None):
    assert parse_accelerator_type(name).machine_type == machine_type


def test_every_compute_engine_size_has_a_machine_type_of_its_chips_per_vm():
    for name in accelerator_types():
        acc = parse_accelerator_type(name)
        if "compute-engine" not in acc.generation.backends:
            assert acc.machine_type is None, name
            continue
        assert acc.machine_type is not None, name
        # The machine type's name ends in "-<chips per VM>t" (ct5p-hightpu-4t, tpu7x-standard-1t).
        assert acc.machine_type.endswith(f"-{acc.chips_per_host}t"), name


def test_backends_per_generation():
    # tpu-machines: "Compute Engine supports the following TPU versions: TPU7x, TPU v6e, TPU v5p";
    # consume-reservation: "The Cloud TPU API is not supported on TPU7x and later TPU versions";
    # About TPUs in GKE: multi-host slice node pools of v4, v5e, v5p, v6e and TPU7x (docs/gke.md section 2).
    assert {g.name: g.backends for g in GENERATIONS.values()} == {
        "v4": ("queued-resource", "gke"),
        "v5e": ("queued-resource", "gke"),
        "v5p": ("queued-resource", "compute-engine", "gke"),
        "v6e": ("queued-resource", "compute-engine", "gke"),
        "tpu7x": ("compute-engine", "gke"),
    }
    assert schema.BACKENDS == NAMES  # multislice:backend's values are the registry's
    for gen in GENERATIONS.values():
        for backend in NAMES:
            assert gen.offered_by(backend) == (backend in gen.backends)


def test_a_catalog_record_naming_an_unregistered_backend_is_refused():
    v4 = GENERATIONS["v4"]
    check_catalog([v4])  # every name registered
    misspelt = dataclasses.replace(v4, backends=("queued-resource", "gke-autopilot"))
    with pytest.raises(RuntimeError, match=r"v4 names backends \['gke-autopilot'\] that infra/backends/registry.py"):
        check_catalog([misspelt])
    with pytest.raises(RuntimeError, match=r"\['gke'\]"):
        check_catalog([v4], names=("queued-resource", "compute-engine"))  # a backend removed from the registry


def test_compute_engine_zones():
    # docs/compute-engine.md section 1 table (regions-zones page, North America).
    assert {g.name: g.compute_engine_zones for g in GENERATIONS.values()} == {
        "v4": (),
        "v5e": (),
        "v5p": ("us-central1-a", "us-east5-a"),
        "v6e": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"),
        "tpu7x": ("us-central1-c", "us-central1-ai1a"),
    }
    for gen in GENERATIONS.values():
        for zone in gen.compute_engine_zones:
            schema.StackConfig._zone_format(zone)  # a zone name the stack file accepts


def test_tpu7x_documented_values():
    tpu7x = GENERATIONS["tpu7x"]
    # https://docs.cloud.google.com/tpu/docs/tpu7x: "Each TPU7x chip contains two TensorCores";
    # "Peak compute per chip (BF16) (TFLOPs) | 2307"; "HBM capacity per chip (GiB) | 192";
    # "Data center network (DCN) bandwidth per chip (Gbps) | 100"; 4-chip VMs.
    assert tpu7x.tensorcores_per_chip == 2
    assert tpu7x.peak_bf16_flops_per_chip == 2307e12
    assert tpu7x.hbm_bytes_per_chip == 192 * 2**30
    assert tpu7x.dcn_bits_per_second_per_chip == 100e9
    assert parse_accelerator_type("tpu7x-16").dcn_bits_per_second_per_host == 400e9
    assert tpu7x.default_runtime_version is None and tpu7x.runtime_versions == ()
    acc = parse_accelerator_type("tpu7x-16")  # xpk: tpu7x-16 = 2x2x2 = 8 chips on 2 VMs
    assert (acc.chips, acc.tensorcores, acc.hosts, acc.chips_per_host) == (8, 16, 2, 4)
    assert max(tpu7x.chip_counts) == 9216  # "Number of chips per pod | 9216"
    for key in ("suffix_counts", "sizes", "topologies"):
        assert "xpk" in tpu7x.sources[key]
    assert "PROXY" in tpu7x.sources["suffix_counts"]  # no Google page names TPU7x types


def test_generation_refuses_inconsistent_backend_data():
    v5p = GENERATIONS["v5p"]
    with pytest.raises(ValueError, match="topology"):
        dataclasses.replace(v5p, topologies=("2x2x2", *v5p.topologies[1:]))  # 8 chips for v5p-8
    with pytest.raises(ValueError, match="one topology per size"):
        dataclasses.replace(v5p, topologies=v5p.topologies[1:])
    with pytest.raises(ValueError, match="machine type"):
        dataclasses.replace(GENERATIONS["v6e"], compute_engine_machine_types={4: "ct6e-standard-4t"})
    with pytest.raises(ValueError, match="backends"):
        dataclasses.replace(v5p, backends=("gke",))
    with pytest.raises(ValueError, match="exactly when compute-engine"):
        dataclasses.replace(v5p, backends=("queued-resource",))
    with pytest.raises(ValueError, match="runtime version"):
        dataclasses.replace(GENERATIONS["tpu7x"], backends=("queued-resource", "compute-engine"))


def test_topology_of_an_unlisted_size_is_refused():
    gen: Generation = GENERATIONS["v4"]
    acc = AcceleratorType("v4-24", gen, chips=12, tensorcores=24, hosts=3, chips_per_host=4)
    with pytest.raises(ValueError, match="not a listed v4 size"):
        _ = acc.topology
