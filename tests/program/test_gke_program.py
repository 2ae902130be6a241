"""The whole program on ``multislice:backend: gke`` stacks under Pulumi's mocks: for each capacity
mode, one slice and several, a new cluster and an existing one, the stack declares a cluster (or
none), one TPU node pool per slice, the Pods' identity, the release's ConfigMap and a JobSet of one
child Job per slice, and passes the policy pack's mandatory rules."""

from __future__ import annotations

import pytest

from infra import startup
from infra.backends.gke.jobset import STARTUP_KEY
from infra.config import validate_stack
from infra.policy.evaluate import check_world
from tests.fakes.pulumi_program import evaluate, stack_map
from tests.helpers.compute_engine import ce_map

JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"


def gke_map(slices: int, capacity: str, **extra) -> dict:
    training = stack_map("dev")["multislice:training"] | {
        "parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": slices, "fsdp": 1, "tensor": 1}},
        "global_batch_size": 16 * slices,
    }
    return stack_map("dev") | {
        "multislice:backend": "gke",
        "multislice:acceleratorType": "v4-16",
        "multislice:slices": slices,
        "multislice:capacity": capacity,
        "multislice:training": training,
        **extra,
    }


#: Each capacity mode once, with one slice or two (a program evaluation is seconds of CPU).
CAPACITIES = [
    ("spot", 2, {}),
    ("on-demand", 1, {}),
    ("reserved", 2, {"multislice:reservationName": "tpu-v4-pool"}),
    ("flex-start", 1, {"multislice:gke": {"maxRunDuration": "3d"}}),
]


@pytest.mark.parametrize(("capacity", "slices", "extra"), CAPACITIES, ids=[c for c, _, _ in CAPACITIES])
def test_each_capacity_mode_with_one_slice_and_several(capacity, slices, extra):
    values = gke_map(slices, capacity, **extra)
    config = validate_stack("dev", values, "test")
    world = evaluate("dev", values)
    assert len(world.of("gcp:container/cluster:Cluster")) == 1
    pools = world.of("gcp:container/nodePool:NodePool")
    assert sorted(pool.inputs["name"] for pool in pools) == config.node_ids
    assert all(pool.inputs["nodeCount"] == 2 for pool in pools)  # v4-16: 2 VMs a slice
    node_config = pools[0].inputs["nodeConfig"]
    assert node_config.get("spot", False) is (capacity == "spot")
    assert ("reservationAffinity" in node_config) is (capacity == "reserved")
    assert ("flexStart" in node_config) is (capacity == "flex-start")
    (jobset,) = world.of(JOBSET)
    (job,) = jobset.inputs["spec"]["replicatedJobs"]
    assert job["replicas"] == slices and job["template"]["spec"]["parallelism"] == 2
    env = {e["name"] for e in job["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert ("MEGASCALE_NUM_SLICES" in env) is (slices > 1)
    (config_map,) = world.of("kubernetes:core/v1:ConfigMap")
    assert config_map.inputs["data"][STARTUP_KEY] == startup.render(config).text  # the release every VM boots
    assert world.exports["nodePoolNames"] == config.node_ids and world.exports["jobSetName"] == "multislice-dev"
    assert [v for v in check_world(world) if v.mandatory] == []


def test_an_existing_cluster_gets_the_pools_and_no_cluster_is_made():
    values = gke_map(2, "spot", **{"multislice:gke": {"cluster": "ml-shared", "clusterLocation": "us-central2"}})
    world = evaluate("dev", values)
    assert world.of("gcp:container/cluster:Cluster") == []
    pools = world.of("gcp:container/nodePool:NodePool")
    assert {pool.inputs["cluster"] for pool in pools} == {"ml-shared"}
    assert {pool.inputs["location"] for pool in pools} == {"us-central2"}
    assert world.exports["clusterName"] == "ml-shared"
    assert [v for v in check_world(world) if v.mandatory] == []


def test_a_tpu7x_stack_places_its_pools_by_a_workload_policy():
    values = ce_map("tpu7x-16") | {"multislice:backend": "gke"}
    config = validate_stack("dev", values, "test")
    world = evaluate("dev", values)
    (policy,) = world.of("gcp:compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert policy.inputs["region"] == "us-central1"
    pools = world.of("gcp:container/nodePool:NodePool")
    assert sorted(pool.inputs["name"] for pool in pools) == config.node_ids
    for pool in pools:
        assert pool.inputs["placementPolicy"]["policyName"] == policy.inputs["name"]
        assert pool.inputs["nodeConfig"]["machineType"] == "tpu7x-standard-4t"
    assert [v for v in check_world(world) if v.mandatory] == []
