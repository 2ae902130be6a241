"""The gke backend's slices under Pulumi's mocks (infra.backends.gke.slices): a new cluster or an
existing one, one node pool per slice with each capacity mode's node config, the Workload Identity
binding, and every refusal before the first resource exists."""

from __future__ import annotations

from typing import Any

import pytest

from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.slices import GkeInputs, GkeSlices
from infra.review.program_mocks import World, declare
from tests.helpers.gke import EMAIL, gke_inputs

CLUSTER = "gcp:container/cluster:Cluster"
POOL = "gcp:container/nodePool:NodePool"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
BINDING = "gcp:serviceaccount/iAMMember:IAMMember"


def inputs(slices: int = 2, accelerator: str = "v5p-16", **changes: Any) -> GkeInputs:
    return gke_inputs(slices, accelerator, **changes)


def build(made: GkeInputs) -> World:
    return declare(lambda: GkeSlices("slices", made))


def test_a_new_cluster_and_a_pool_per_slice():
    world = build(inputs(slices=3))
    cluster = world.one(CLUSTER)
    assert cluster.inputs["name"] == "multislice-dev" and cluster.inputs["location"] == "us-east5-a"
    assert cluster.inputs["privateClusterConfig"] == {"enablePrivateNodes": True, "enablePrivateEndpoint": True}
    assert cluster.inputs["workloadIdentityConfig"] == {"workloadPool": "acme-ml-dev.svc.id.goog"}
    pools = world.of(POOL)
    # (Registered concurrently: in no particular order.)
    assert sorted(p.inputs["name"] for p in pools) == ["multislice-dev-0", "multislice-dev-1", "multislice-dev-2"]
    for pool in pools:
        # v5p-16: 2 VMs of ct5p-hightpu-4t in 2x2x2 (Google's v5p table).
        assert pool.inputs["nodeCount"] == 2 and pool.inputs["nodeLocations"] == ["us-east5-a"]
        assert pool.inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"}
        node = pool.inputs["nodeConfig"]
        assert node["machineType"] == "ct5p-hightpu-4t" and node["spot"] is True
        assert node["serviceAccount"] == EMAIL and node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert pool.inputs["location"] == "us-east5-a"
        assert cluster.urn in pool.dependencies  # a pool is added to the cluster once it exists
    binding = world.one(BINDING)
    assert binding.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert binding.inputs["member"] == "serviceAccount:acme-ml-dev.svc.id.goog[default/multislice-dev]"
    assert cluster.urn in binding.dependencies  # the workload pool exists once the cluster does


def test_an_existing_cluster_gets_the_pools_and_no_cluster_is_made():
    world = build(inputs(settings=GkeSettings(cluster="shared-tpu", clusterLocation="us-east5", namespace="ml")))
    assert world.of(CLUSTER) == []
    for pool in world.of(POOL):
        assert (pool.inputs["cluster"], pool.inputs["location"]) == ("shared-tpu", "us-east5")
        assert pool.inputs["nodeLocations"] == ["us-east5-a"]
    assert world.one(BINDING).inputs["member"] == "serviceAccount:acme-ml-dev.svc.id.goog[ml/multislice-dev]"


@pytest.mark.parametrize(
    ("capacity", "extra", "expected"),
    [
        ("on-demand", {}, {}),
        (
            "reserved",
            {"reservation_name": "tpu-res"},
            {
                "reservationAffinity": {
                    "consumeReservationType": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["tpu-res"],
                }
            },
        ),
        ("flex-start", {"max_run_duration_seconds": 3600}, {"flexStart": True, "maxRunDuration": "3600s"}),
    ],
)
def test_each_capacity_mode_reaches_every_pool(capacity, extra, expected):
    world = build(inputs(capacity=capacity, **extra))
    keys = {"spot", "flexStart", "reservationAffinity", "maxRunDuration"}
    for pool in world.of(POOL):
        assert {k: v for k, v in pool.inputs["nodeConfig"].items() if k in keys} == expected


def test_one_slice_is_one_pool():
    assert len(build(inputs(slices=1)).of(POOL)) == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"settings": GkeSettings(cluster="shared-tpu", clusterLocation="europe-west4")},
            "multislice:gke.clusterLocation: the cluster is in region europe-west4",
        ),
        ({"capacity": "preemptible"}, "multislice:capacity: 'preemptible' is not one of"),
        ({"pool_names": ()}, "multislice:slices: a gke stack needs at least one slice"),
    ],
)
def test_what_gke_cannot_build_is_refused_before_any_resource(changes, message):
    registered: list[str] = []

    def attempt() -> None:
        try:
            GkeSlices("slices", inputs(**changes))
        except ValueError as err:
            registered.append(str(err))

    world = declare(attempt)
    assert world.registrations == [] and message in registered[0], (registered, world.registrations)


def test_tpu7x_pools_name_one_regional_workload_policy():
    world = build(inputs(accelerator="tpu7x-16"))
    policy = world.one(POLICY)
    # tpu7x-16: 8 chips (2 TensorCores each) in 2x2x2, 2 VMs of 4 chips (Google's TPU7x table).
    assert (policy.inputs["name"], policy.inputs["region"]) == ("multislice-dev-workload-policy", "us-east5")
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    pools = world.of(POOL)
    assert len(pools) == 2
    for pool in pools:
        assert pool.inputs["nodeCount"] == 2 and pool.inputs["nodeConfig"]["machineType"] == "tpu7x-standard-4t"
        placement = pool.inputs["placementPolicy"]
        assert placement == {"type": "", "policyName": "multislice-dev-workload-policy", "tpuTopology": "2x2x2"}
        assert policy.urn in pool.dependencies
    assert world.of(POLICY) == [policy] and all(
        p.inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"} for p in build(inputs()).of(POOL)
    )  # no policy for the other generations
