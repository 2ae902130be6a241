"""The gke backend's node pool per slice (infra.backends.gke.node_pools): its shape for every
multi-host accelerator type the catalog lists, the refusals of what GKE cannot give as a Multislice
node pool, and its ``node_config`` per capacity mode, checked against pulumi-gcp's own input types."""

from __future__ import annotations

from typing import Any

import pytest
from pulumi_gcp.container import _inputs as container_inputs

from infra.accelerators import accelerator_types, parse_accelerator_type
from infra.accelerators.generation import topology_chips
from infra.backends.gke.node_pools import (
    GKE_TPUS,
    NodePoolError,
    node_config,
    node_selector,
    placement_policy,
    pool_size,
    slice_node_pool,
    system_pool,
    workload_policy_args,
)

GKE_TYPES = [name for name in accelerator_types() if parse_accelerator_type(name).generation.name in GKE_TPUS]
MULTI_HOST = [name for name in GKE_TYPES if parse_accelerator_type(name).hosts > 1]
SINGLE_HOST = [name for name in GKE_TYPES if parse_accelerator_type(name).hosts == 1]


def test_the_catalog_has_types_of_both_kinds():
    assert len(MULTI_HOST) > 10 and len(SINGLE_HOST) >= 5, (MULTI_HOST, SINGLE_HOST)


@pytest.mark.parametrize("name", MULTI_HOST)
def test_each_multi_host_slice_is_one_pool_of_its_vms(name):
    accelerator = parse_accelerator_type(name)
    shape = slice_node_pool(accelerator)
    # The machine type's name ends in its chips per VM ("…-4t"); every chip of the slice is in a node.
    assert shape.machine_type.endswith(f"-{shape.chips_per_node}t")
    assert shape.node_count * shape.chips_per_node == accelerator.chips
    assert topology_chips(shape.topology) == accelerator.chips
    assert node_selector(shape) == {
        "cloud.google.com/gke-tpu-accelerator": shape.accelerator,
        "cloud.google.com/gke-tpu-topology": shape.topology,
    }


def test_the_documented_pools():
    # docs/gke.md section 2: v5p-16 is 2 VMs of ct5p-hightpu-4t in 2x2x2; v6e-16 is 4 VMs of
    # ct6e-standard-4t in 4x4 (Google's v5p and v6e tables).
    v5p = slice_node_pool(parse_accelerator_type("v5p-16"))
    assert (v5p.machine_type, v5p.accelerator, v5p.topology, v5p.node_count) == (
        "ct5p-hightpu-4t",
        "tpu-v5p-slice",
        "2x2x2",
        2,
    )
    assert dict(placement_policy(v5p)) == {"type": "COMPACT", "tpu_topology": "2x2x2"}
    v6e = slice_node_pool(parse_accelerator_type("v6e-16"))
    assert (v6e.machine_type, v6e.accelerator, v6e.topology, v6e.node_count) == (
        "ct6e-standard-4t",
        "tpu-v6e-slice",
        "4x4",
        4,
    )


@pytest.mark.parametrize(
    ("name", "smallest"),
    # Google's Multislice-on-GKE page names these two single-host pools as unusable; the next
    # multi-host sizes are from Google's v4 and v5e tables (v4-16: 2 VMs; v5litepod-16: 4 VMs).
    [("v4-8", "v4-16"), ("v5litepod-4", "v5litepod-16"), ("v5p-8", "v5p-16"), ("v6e-8", "v6e-16")],
)
def test_a_single_vm_slice_is_refused_naming_the_key_and_the_smallest_multi_host_type(name, smallest):
    with pytest.raises(NodePoolError) as raised:
        slice_node_pool(parse_accelerator_type(name))
    message = str(raised.value)
    assert message.startswith(f"multislice:acceleratorType: {name} is one VM per slice")
    assert f"the smallest multi-host {parse_accelerator_type(name).generation.name} slice is {smallest}" in message


def test_every_single_host_type_is_refused():
    for name in SINGLE_HOST:
        with pytest.raises(NodePoolError, match="multi-host slice node pools only"):
            slice_node_pool(parse_accelerator_type(name))


def test_tpu7x_pools_name_a_high_throughput_workload_policy_with_compact_placement():
    name = next(n for n in MULTI_HOST if n.startswith("tpu7x-"))
    shape = slice_node_pool(parse_accelerator_type(name))
    assert shape.workload_policy and shape.machine_type == "tpu7x-standard-4t"
    with pytest.raises(ValueError, match="needs its workload policy's name"):
        placement_policy(shape)
    # Cluster Toolkit's resource-policy module gives a TPU7x pool type COMPACT, the policy's name and
    # the workload policy's accelerator topology (its placement_policy output).
    assert placement_policy(shape, "wp") == {"type": "COMPACT", "policy_name": "wp", "tpu_topology": shape.topology}
    assert workload_policy_args(shape) == {"type": "HIGH_THROUGHPUT", "accelerator_topology": shape.topology}
    for other in (n for n in MULTI_HOST if not n.startswith("tpu7x-")):
        compact = slice_node_pool(parse_accelerator_type(other))
        assert placement_policy(compact, "ignored") == {"type": "COMPACT", "tpu_topology": compact.topology}


def _keys(typed_dict: Any) -> set[str]:
    """The keys a pulumi-gcp args TypedDict takes; asserts its required ones are in ``given``."""
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def _fits(given: dict[str, Any], typed_dict: Any) -> bool:
    """Whether ``given`` holds only keys of ``typed_dict`` and every key it requires."""
    return set(typed_dict.__required_keys__) <= set(given) <= _keys(typed_dict)


SHAPE = slice_node_pool(parse_accelerator_type("v5p-16"))


@pytest.mark.parametrize(
    ("capacity", "reservation", "duration", "expected"),
    [
        # Cluster Toolkit: "Spot consumption option only works with ... NO_RESERVATION".
        ("spot", None, None, {"spot": True, "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}}),
        ("on-demand", None, None, {}),
        (
            "reserved",
            "res-a",
            None,
            {
                "reservation_affinity": {
                    "consume_reservation_type": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["res-a"],
                }
            },
        ),
        ("reserved", None, None, {"reservation_affinity": {"consume_reservation_type": "ANY_RESERVATION"}}),
        # Cluster Toolkit: "enable_flex_start requires ... NO_RESERVATION".
        (
            "flex-start",
            None,
            86400,
            {
                "flex_start": True,
                "max_run_duration": "86400s",
                "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
            },
        ),
    ],
)
def test_each_capacity_mode_is_its_node_config(capacity, reservation, duration, expected):
    config: dict[str, Any] = dict(
        node_config(
            SHAPE,
            capacity,
            service_account="sa@p.iam.gserviceaccount.com",
            reservation=reservation,
            max_run_duration_s=duration,
            labels={"stack": "dev"},
        )
    )
    capacity_keys = {"spot", "flex_start", "reservation_affinity", "max_run_duration", "preemptible"}
    assert {k: v for k, v in config.items() if k in capacity_keys} == expected
    assert config["machine_type"] == "ct5p-hightpu-4t"
    assert config["workload_metadata_config"] == {"mode": "GKE_METADATA"}  # Workload Identity's metadata server
    assert config["resource_labels"] == {"stack": "dev"}
    # Every key is one pulumi-gcp's NodePool takes, at each level.
    assert _fits(config, container_inputs.NodePoolNodeConfigArgsDict)
    assert _fits(config["workload_metadata_config"], container_inputs.NodePoolNodeConfigWorkloadMetadataConfigArgsDict)
    if "reservation_affinity" in config:
        assert _fits(config["reservation_affinity"], container_inputs.NodePoolNodeConfigReservationAffinityArgsDict)
    # Every TPU pool is tainted as Cluster Toolkit's tpu-definition taints it.
    assert config["taints"] == [{"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert _fits(config["taints"][0], container_inputs.NodePoolNodeConfigTaintArgsDict)


@pytest.mark.parametrize("capacity", ["spot", "on-demand", "reserved", "flex-start"])
def test_a_pool_holds_the_slices_vms_and_flex_start_scales_from_zero_without_repair(capacity):
    # Cluster Toolkit: flex-start "does not work with static_node_count", "needs node auto_repair set to
    # false", autoscaling with location_policy ANY; xpk: --num-nodes=0 --max-nodes=<VMs>.
    size = pool_size(SHAPE, capacity)
    if capacity != "flex-start":
        assert size == {"node_count": 2}  # v5p-16: 2 VMs
        return
    assert size == {
        # Per-zone bounds, as Cluster Toolkit's dws-flex-start TPU blueprints set them (autoscaling_min_node_count 0,
        # autoscaling_max_node_count = the slice's VMs): GKE refuses a TPU slice pool whose per-zone maximum is 0.
        "autoscaling": {"min_node_count": 0, "max_node_count": 2, "location_policy": "ANY"},
        "management": {"auto_repair": False, "auto_upgrade": True},
    }
    assert _fits(size["autoscaling"], container_inputs.NodePoolAutoscalingArgsDict)
    assert _fits(size["management"], container_inputs.NodePoolManagementArgsDict)


def test_the_system_pool_is_an_autoscaled_cpu_pool_without_taints():
    args = system_pool(machine_type="e2-standard-4", min_nodes=1, max_nodes=3, service_account="sa@p", labels={})
    assert args["autoscaling"] == {"total_min_node_count": 1, "total_max_node_count": 3}
    assert args["management"] == {"auto_repair": True, "auto_upgrade": True}
    node = args["node_config"]
    assert node["machine_type"] == "e2-standard-4" and "taints" not in node
    assert node["workload_metadata_config"] == {"mode": "GKE_METADATA"} and node["service_account"] == "sa@p"
    assert _fits(node, container_inputs.NodePoolNodeConfigArgsDict)


def test_the_placement_policy_is_one_pulumi_gcp_takes():
    assert _fits(dict(placement_policy(SHAPE)), container_inputs.NodePoolPlacementPolicyArgsDict)


def test_flex_start_without_a_run_duration_takes_gke_s_and_an_unknown_capacity_is_refused():
    config = dict(node_config(SHAPE, "flex-start", service_account="sa"))
    assert config["flex_start"] is True and "max_run_duration" not in config  # GKE's default: seven days
    with pytest.raises(NodePoolError, match=r"multislice:capacity: 'preemptible' is not one of"):
        node_config(SHAPE, "preemptible", service_account="sa")


@pytest.mark.parametrize(
    ("accelerator", "disk"),
    [("v6e-16", "hyperdisk-balanced"), ("tpu7x-16", "hyperdisk-balanced"), ("v5p-16", None), ("v4-16", None)],
)
def test_the_boot_disk_and_gvnic_are_what_google_s_blueprints_give_each_generation(accelerator, disk):
    # Cluster Toolkit: every v6e and TPU7x blueprint sets disk_type hyperdisk-balanced; gke-node-pool enables gVNIC
    # on every Container-Optimized OS pool. Elsewhere GKE's default disk.
    config = node_config(slice_node_pool(parse_accelerator_type(accelerator)), "spot", service_account="sa")
    assert config["gvnic"] == {"enabled": True}
    assert config.get("disk_type") == disk
    assert _fits(dict(config), container_inputs.NodePoolNodeConfigArgsDict)
