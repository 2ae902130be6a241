"""infra.backends.compute_engine.tpu_env: the TPU environment of Google's tpu-operator sample,
derived from a slice's shape for every compute-engine accelerator type of the catalog. The
expected values are written out by hand: the sample's for TPU7x 2x2x2 on 2 VMs (its README,
"Step 4"), and the same division for the other shapes from Google's topology tables."""

from __future__ import annotations

import math

import pytest

from infra.accelerators import accelerator_types, parse_accelerator_type
from infra.backends.compute_engine import tpu_env


@pytest.mark.parametrize(
    ("accelerator", "topology", "host_bounds", "chip_bounds", "metrics_ports"),
    [
        ("tpu7x-16", "2x2x2", "1,1,2", "2,2,1", "8431,8432,8433,8434"),  # the sample, exactly
        ("v5p-8", "2x2x1", "1,1,1", "2,2,1", "8431,8432,8433,8434"),
        ("v5p-32", "2x2x4", "1,1,4", "2,2,1", "8431,8432,8433,8434"),
        ("v6e-1", "1x1", "1,1,1", "1,1,1", "8431"),
        ("v6e-8", "2x4", "1,1,1", "2,4,1", "8431,8432,8433,8434,8435,8436,8437,8438"),
        ("v6e-16", "4x4", "2,2,1", "2,2,1", "8431,8432,8433,8434"),
        ("v6e-32", "4x8", "2,4,1", "2,2,1", "8431,8432,8433,8434"),
        ("v6e-256", "16x16", "8,8,1", "2,2,1", "8431,8432,8433,8434"),
    ],
)
def test_the_environment_of_each_shape(accelerator, topology, host_bounds, chip_bounds, metrics_ports):
    acc = parse_accelerator_type(accelerator)
    assert tpu_env.static_environment(acc.topology, acc.hosts, acc.chips_per_host) == {
        "TPU_TOPOLOGY": topology,
        "TPU_HOST_BOUNDS": host_bounds,
        "TPU_CHIPS_PER_HOST_BOUNDS": chip_bounds,
        "TPU_PROCESS_PORT": "8470",
        "TPU_RUNTIME_METRICS_PORTS": metrics_ports,
    }


def test_every_compute_engine_accelerator_type_of_the_catalog_has_one():
    """The host bounds hold the slice's VMs and the chip bounds a VM's chips, for every type."""
    offered = [parse_accelerator_type(name) for name in accelerator_types()]
    offered = [acc for acc in offered if acc.generation.offered_by("compute-engine")]
    assert {acc.generation.name for acc in offered} == {"v5p", "v6e", "tpu7x"}
    for acc in offered:
        env = tpu_env.static_environment(acc.topology, acc.hosts, acc.chips_per_host)
        hosts = [int(b) for b in env["TPU_HOST_BOUNDS"].split(",")]
        chips = [int(b) for b in env["TPU_CHIPS_PER_HOST_BOUNDS"].split(",")]
        assert (math.prod(hosts), math.prod(chips)) == (acc.hosts, acc.chips_per_host), acc.name
        assert tpu_env.metadata_value(env).count("=") == 5


@pytest.mark.parametrize(
    ("topology", "hosts", "chips_per_host", "words"),
    [
        ("2x2x2", 4, 2, "no chips-per-host bounds for a multi-host slice of 2-chip VMs"),
        ("3x4", 3, 4, "topology 3x4 does not split into 2x2x1 blocks of chips"),
        ("4x4", 2, 4, "topology 4x4 in 2x2x1 blocks is not 2 VMs"),
        ("2x0", 1, 1, "is not 1 to 3 positive dims"),
    ],
)
def test_a_shape_the_derivation_does_not_cover_is_refused(topology, hosts, chips_per_host, words):
    with pytest.raises(ValueError, match=words):
        tpu_env.static_environment(topology, hosts, chips_per_host)
