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


def tpu_pools(world: World) -> list:
    """The slices' pools (a new cluster's system pool left out)."""
    return [pool for pool in world.of(POOL) if pool.name != "system"]


def test_a_new_cluster_and_a_pool_per_slice():
    world = build(inputs(slices=3))
    cluster = world.one(CLUSTER)
    assert cluster.inputs["name"] == "multislice-dev" and cluster.inputs["location"] == "us-east5-a"
    assert cluster.inputs["privateClusterConfig"] == {"enablePrivateNodes": True, "enablePrivateEndpoint": True}
    assert cluster.inputs["workloadIdentityConfig"] == {"workloadPool": "acme-ml-dev.svc.id.goog"}
    pools = tpu_pools(world)
    # (Registered concurrently: in no particular order.)
    assert sorted(p.inputs["name"] for p in pools) == ["multislice-dev-0", "multislice-dev-1", "multislice-dev-2"]
    for pool in pools:
        # v5p-16: 2 VMs of ct5p-hightpu-4t in 2x2x2 (Google's v5p table).
        assert pool.inputs["nodeCount"] == 2 and pool.inputs["nodeLocations"] == ["us-east5-a"]
        assert pool.inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"}
        node = pool.inputs["nodeConfig"]
        assert node["machineType"] == "ct5p-hightpu-4t" and node["spot"] is True
        assert node["taints"] == [{"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}]
        assert node["serviceAccount"] == EMAIL and node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert pool.inputs["location"] == "us-east5-a"
        assert cluster.urn in pool.dependencies  # a pool is added to the cluster once it exists
    binding = world.one(BINDING)
    assert binding.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert binding.inputs["member"] == "serviceAccount:acme-ml-dev.svc.id.goog[default/multislice-dev]"
    assert cluster.urn in binding.dependencies  # the workload pool exists once the cluster does


def test_a_regional_cluster_keeps_every_node_in_the_stacks_zone():
    # GKE's "Regional clusters": the control plane is replicated in the region, and a pool's nodes go to the
    # zones it names (every zone of the region by default); a zonal cluster's node_locations omits its zone.
    world = build(inputs(settings=GkeSettings(regional=True)))
    cluster = world.one(CLUSTER)
    assert (cluster.inputs["location"], cluster.inputs["nodeLocations"]) == ("us-east5", ["us-east5-a"])
    for pool in world.of(POOL):  # the system pool and the slices' pools
        assert (pool.inputs["location"], pool.inputs["nodeLocations"]) == ("us-east5", ["us-east5-a"]), pool.name
    assert "nodeLocations" not in build(inputs()).one(CLUSTER).inputs


def test_a_new_cluster_has_a_system_pool_a_channel_an_exclusion_and_explicit_deletion_protection():
    # Cluster Toolkit's gke-cluster and its TPU blueprints: REGULAR, a daily window at 09:00, the
    # exclusion no-minor-or-node-upgrades-indefinite from 2025-12-01 until the end of support, an
    # e2-standard-4 system pool; deletion protection false unless asked (pulumi-gcp defaults to true).
    world = build(inputs())
    cluster = world.one(CLUSTER).inputs
    assert cluster["deletionProtection"] is False and "minMasterVersion" not in cluster
    assert cluster["releaseChannel"] == {"channel": "REGULAR"}
    assert cluster["maintenancePolicy"] == {
        "dailyMaintenanceWindow": {"startTime": "09:00"},
        "maintenanceExclusions": [
            {
                "exclusionName": "no-minor-or-node-upgrades-indefinite",
                "startTime": "2025-12-01T00:00:00Z",
                "exclusionOptions": {"scope": "NO_MINOR_OR_NODE_UPGRADES", "endTimeBehavior": "UNTIL_END_OF_SUPPORT"},
            }
        ],
    }
    (system,) = [pool for pool in world.of(POOL) if pool.name == "system"]
    assert system.inputs["autoscaling"] == {"totalMinNodeCount": 1, "totalMaxNodeCount": 3}
    assert system.inputs["nodeConfig"]["machineType"] == "e2-standard-4"
    assert "taints" not in system.inputs["nodeConfig"] and "nodeCount" not in system.inputs
    protected = build(
        inputs(
            settings=GkeSettings(deletionProtection=True, version="1.35", systemPool={"machineType": "n2-standard-8"})
        )
    )
    cluster = protected.one(CLUSTER).inputs
    assert cluster["deletionProtection"] is True and cluster["minMasterVersion"] == "1.35"
    assert [p.inputs["nodeConfig"]["machineType"] for p in protected.of(POOL) if p.name == "system"] == [
        "n2-standard-8"
    ]


def test_an_existing_cluster_gets_the_pools_and_no_cluster_is_made():
    world = build(inputs(settings=GkeSettings(cluster="shared-tpu", clusterLocation="us-east5", namespace="ml")))
    assert world.of(CLUSTER) == [] and [p.name for p in world.of(POOL) if p.name == "system"] == []
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
        (
            "flex-start",
            {"max_run_duration_seconds": 3600},
            {
                "flexStart": True,
                "maxRunDuration": "3600s",
                "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"},
            },
        ),
    ],
)
def test_each_capacity_mode_reaches_every_pool(capacity, extra, expected):
    world = build(inputs(capacity=capacity, **extra))
    keys = {"spot", "flexStart", "reservationAffinity", "maxRunDuration"}
    for pool in tpu_pools(world):
        assert {k: v for k, v in pool.inputs["nodeConfig"].items() if k in keys} == expected
        if capacity == "flex-start":  # from 0 to the slice's 2 VMs, GKE's repair off (Cluster Toolkit)
            assert "nodeCount" not in pool.inputs and pool.inputs["management"]["autoRepair"] is False
            assert pool.inputs["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 2, "locationPolicy": "ANY"}
        else:
            assert pool.inputs["nodeCount"] == 2 and "autoscaling" not in pool.inputs


def test_one_slice_is_one_pool():
    assert len(tpu_pools(build(inputs(slices=1)))) == 1


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
    pools = tpu_pools(world)
    assert len(pools) == 2
    for pool in pools:
        assert pool.inputs["nodeCount"] == 2 and pool.inputs["nodeConfig"]["machineType"] == "tpu7x-standard-4t"
        placement = pool.inputs["placementPolicy"]  # Cluster Toolkit's TPU7x placement
        assert placement == {"type": "COMPACT", "policyName": "multislice-dev-workload-policy", "tpuTopology": "2x2x2"}
        assert policy.urn in pool.dependencies
    assert world.of(POLICY) == [policy] and all(
        p.inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"} for p in tpu_pools(build(inputs()))
    )  # no policy for the other generations
