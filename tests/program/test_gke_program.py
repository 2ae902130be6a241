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
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import ce_map
from tests.helpers.gke import gke_map

JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"


#: Each capacity mode once, with one slice or two (a program evaluation is seconds of CPU).
CAPACITIES = [
    ("spot", 2, {}),
    ("on-demand", 1, {}),
    ("reserved", 2, {"multislice:reservationName": "tpu-v4-pool"}),
    # GKE's flex-start takes no TPU v4 ("TPU v3 and v4 are not supported"): a v5p-16 slice, 2 VMs too.
    (
        "flex-start",
        1,
        {"multislice:gke": {"maxRunDuration": "3d"}, "gcp:zone": "us-east5-a", "multislice:acceleratorType": "v5p-16"},
    ),
]
#: The reservation affinity each capacity's pools ask for (Cluster Toolkit: Spot and flex-start only
#: with NO_RESERVATION; a reservation by name; on-demand: GKE's default, none sent).
AFFINITY = {"spot": "NO_RESERVATION", "reserved": "SPECIFIC_RESERVATION", "flex-start": "NO_RESERVATION"}


@pytest.mark.parametrize(("capacity", "slices", "extra"), CAPACITIES, ids=[c for c, _, _ in CAPACITIES])
def test_each_capacity_mode_with_one_slice_and_several(capacity, slices, extra):
    values = gke_map(slices, capacity, **extra)
    config = validate_stack("dev", values, "test")
    world = evaluate("dev", values)
    assert len(world.of("gcp:container/cluster:Cluster")) == 1
    everything = world.of("gcp:container/nodePool:NodePool")
    pools = [pool for pool in everything if pool.name != "system"]
    assert sorted(pool.inputs["name"] for pool in everything) == sorted([*config.node_ids, "system"])
    for pool in pools:  # 2 VMs a slice: fixed, or on flex-start the autoscaler's most
        size = pool.inputs.get("nodeCount") or pool.inputs["autoscaling"]["maxNodeCount"]
        assert size == 2 and ("nodeCount" in pool.inputs) is (capacity != "flex-start")
    node_config = pools[0].inputs["nodeConfig"]
    assert node_config.get("spot", False) is (capacity == "spot")
    affinity = node_config.get("reservationAffinity", {}).get("consumeReservationType")
    assert affinity == AFFINITY.get(capacity)
    assert ("flexStart" in node_config) is (capacity == "flex-start")
    (jobset,) = world.of(JOBSET)
    (job,) = jobset.inputs["spec"]["replicatedJobs"]
    assert job["replicas"] == slices and job["template"]["spec"]["parallelism"] == 2
    env = {e["name"] for e in job["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert ("MEGASCALE_NUM_SLICES" in env) is (slices > 1)
    (config_map,) = world.of("kubernetes:core/v1:ConfigMap")
    assert config_map.inputs["data"][STARTUP_KEY] == startup.render(config).text  # the release every VM boots
    assert world.exports["nodePoolNames"] == config.node_ids and world.exports["jobSetName"] == "multislice-dev"
    # Deletion protection off, sent explicitly: a destroy deletes the cluster (pulumi-gcp's default refuses).
    assert world.exports["clusterOnDestroy"] == "deleted: cluster multislice-dev, its system pool and its node pools"
    assert world.one("gcp:container/cluster:Cluster").inputs["deletionProtection"] is False
    assert [v for v in check_world(world) if v.mandatory] == []


def test_an_existing_cluster_gets_the_pools_and_no_cluster_is_made():
    values = gke_map(2, "spot", **{"multislice:gke": {"cluster": "ml-shared", "clusterLocation": "us-central2"}})
    world = evaluate("dev", values)
    assert world.of("gcp:container/cluster:Cluster") == []
    pools = world.of("gcp:container/nodePool:NodePool")
    assert {pool.inputs["cluster"] for pool in pools} == {"ml-shared"}
    assert {pool.inputs["location"] for pool in pools} == {"us-central2"}
    assert world.exports["clusterName"] == "ml-shared"
    assert world.exports["clusterOnDestroy"].startswith("kept: cluster ml-shared is not the stack's")
    assert [v for v in check_world(world) if v.mandatory] == []


def test_a_tpu7x_stack_places_its_pools_by_a_workload_policy():
    values = ce_map("tpu7x-16") | {"multislice:backend": "gke"}
    config = validate_stack("dev", values, "test")
    world = evaluate("dev", values)
    (policy,) = world.of("gcp:compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert policy.inputs["region"] == "us-central1"
    pools = [pool for pool in world.of("gcp:container/nodePool:NodePool") if pool.name != "system"]
    assert sorted(pool.inputs["name"] for pool in pools) == config.node_ids
    for pool in pools:  # Cluster Toolkit's TPU7x placement: COMPACT, the policy and the topology
        assert pool.inputs["placementPolicy"] == {
            "type": "COMPACT",
            "policyName": policy.inputs["name"],
            "tpuTopology": "2x2x2",
        }
        assert pool.inputs["nodeConfig"]["machineType"] == "tpu7x-standard-4t"
    assert [v for v in check_world(world) if v.mandatory] == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            {"nodePools": [{"name": "default-pool", "nodeConfigs": [{"machineType": "e2-standard-4"}]}]},
            "multislice:gke.cluster: cluster ml-shared has no Workload Identity pool acme-ml-dev.svc.id.goog",
        ),
        (
            {
                "workloadIdentityConfigs": [{"workloadPool": "acme-ml-dev.svc.id.goog"}],
                "nodePools": [{"name": "tpu", "nodeConfigs": [{"machineType": "ct5p-hightpu-4t"}]}],
            },
            "multislice:gke.cluster: cluster ml-shared has only TPU node pools",
        ),
        (
            {
                "workloadIdentityConfigs": [{"workloadPool": "acme-ml-dev.svc.id.goog"}],
                "nodePools": [{"name": "default-pool", "nodeConfigs": [{"machineType": "e2-standard-4"}]}],
                "masterVersion": "1.33.5-gke.1000",
            },
            "multislice:gke.cluster: cluster ml-shared runs GKE 1.33.5-gke.1000, below 1.34.0-gke.2201000, which",
        ),
    ],
)
def test_an_existing_cluster_that_cannot_take_the_run_is_refused_naming_the_key(answer, message):
    values = ce_map("tpu7x-16") | {
        "multislice:backend": "gke",
        "multislice:gke": {"cluster": "ml-shared", "clusterLocation": "us-central1"},
    }
    with pytest.raises(Exception) as caught:
        evaluate("dev", values, existing_cluster=answer)
    assert message in str(caught.value) and "\n" not in str(caught.value).strip()


def test_a_protected_cluster_says_how_to_destroy_it():
    values = gke_map(2, "spot", **{"multislice:gke": {"deletionProtection": True}})
    world = evaluate("dev", values)
    assert world.one("gcp:container/cluster:Cluster").inputs["deletionProtection"] is True
    assert world.exports["clusterOnDestroy"] == (
        "refused: cluster multislice-dev has deletion protection; set multislice:gke.deletionProtection: false, "
        "run pulumi up, then pulumi destroy"
    )


SHARED = {"cluster": "ml-shared", "clusterLocation": "us-central1"}


def test_an_existing_cluster_is_left_as_it_was_found():
    # Cluster Toolkit and xpk install JobSet only on clusters they create: the stack reads the shared cluster's
    # controller and declares only its own objects, which pulumi destroy then removes.
    values = ce_map("tpu7x-16") | {"multislice:backend": "gke", "multislice:gke": SHARED | {"namespace": "ml"}}
    world = evaluate("dev", values)
    declared = {r.typ for r in world.registrations if r.typ.startswith("kubernetes:")}
    assert declared == {
        "kubernetes:core/v1:ConfigMap",
        "kubernetes:core/v1:ServiceAccount",
        "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet",
    }  # no ConfigFile (the controller and its CRD), no Namespace (the cluster's own)
    reads = [read for read in world.reads if read[0] != "pulumi:pulumi:StackReference"]  # the stack's own outputs
    assert reads == [("kubernetes:apps/v1:Deployment", "jobset-system/jobset-controller-manager")]
    assert world.of("gcp:container/cluster:Cluster") == []
    # A cluster the stack makes gets the controller, as before.
    own = evaluate("dev", ce_map("tpu7x-16") | {"multislice:backend": "gke"})
    assert len(own.of("kubernetes:yaml/v2:ConfigFile")) == 1
    assert [read for read in own.reads if read[0].startswith("kubernetes:")] == []


@pytest.mark.parametrize(
    ("image", "refused"),
    [
        (
            "registry.k8s.io/jobset/jobset:v0.8.1",
            "runs JobSet v0.8.1 (jobset-system/jobset-controller-manager), below v0.10.1",
        ),
        ("registry.k8s.io/jobset/jobset:v0.10.1", None),
        ("registry.k8s.io/jobset/jobset:v0.12.0", None),
        ("us-docker.pkg.dev/team/jobset:dev-build", None),  # a build of their own: a warning
    ],
)
def test_an_existing_cluster_s_jobset_is_checked_naming_the_key(image, refused):
    values = ce_map("tpu7x-16") | {"multislice:backend": "gke", "multislice:gke": SHARED}
    if refused is None:
        assert evaluate("dev", values, jobset_image=image).of("kubernetes:jobset.x-k8s.io/v1alpha2:JobSet")
        return
    with pytest.raises(Exception) as caught:
        evaluate("dev", values, jobset_image=image)
    message = str(caught.value).strip()
    assert (
        message.startswith("multislice:gke.cluster: cluster ml-shared ") and refused in message and "\n" not in message
    )


@pytest.mark.parametrize(
    ("gke", "refused"),
    [
        (SHARED | {"installJobSet": True}, "multislice:gke.installJobSet: is true and multislice:gke.cluster names"),
        (SHARED | {"jobSetVersion": "v0.12.0"}, "multislice:gke.jobSetVersion: configures the cluster the stack makes"),
    ],
)
def test_an_existing_cluster_s_jobset_is_never_the_stack_s(gke, refused):
    values = ce_map("tpu7x-16") | {"multislice:backend": "gke", "multislice:gke": gke}
    with pytest.raises(ValueError, match=refused):
        validate_stack("dev", values, "test")
    # installJobSet: false says what the stack does anyway on an existing cluster: accepted.
    validate_stack("dev", values | {"multislice:gke": SHARED | {"installJobSet": False}}, "test")


HOST = "acme-net-host"
SHARED_VPC = {
    "existingNetwork": f"projects/{HOST}/global/networks/shared",
    "existingSubnetwork": "tpus",
    "nat": False,
}
NETWORK_URL = f"https://www.googleapis.com/compute/v1/projects/{HOST}/global/networks/shared"


def test_a_new_cluster_on_a_shared_vpc_takes_the_subnetwork_s_named_ranges():
    # Cluster Toolkit's gke-cluster names both ranges (pods_ip_range_name, services_ip_range_name); the Container
    # API takes "an existing secondary range associated with the cluster subnetwork".
    values = gke_map(2, "spot") | {
        "multislice:network": SHARED_VPC,
        "multislice:gke": {"podRange": "tpu-pods", "serviceRange": "tpu-services"},
    }
    world = evaluate("dev", values, subnet_network=NETWORK_URL)
    cluster = world.one("gcp:container/cluster:Cluster").inputs
    assert cluster["ipAllocationPolicy"] == {
        "clusterSecondaryRangeName": "tpu-pods",
        "servicesSecondaryRangeName": "tpu-services",
    }
    assert cluster["subnetwork"] == f"projects/{HOST}/regions/us-central2/subnetworks/tpus"
    # Without them GKE adds ranges to the subnetwork, which only a network of the stack's project allows.
    own = evaluate("dev", gke_map(2, "spot")).one("gcp:container/cluster:Cluster").inputs
    assert own["ipAllocationPolicy"] == {}


@pytest.mark.parametrize(
    ("network", "gke", "refused"),
    [
        (SHARED_VPC, {}, "multislice:gke.podRange: is required on the Shared VPC subnetwork of project acme-net-host"),
        (None, {"podRange": "a", "serviceRange": "b"}, "multislice:gke.podRange: names a secondary range of a reused"),
        (SHARED_VPC, {"podRange": "a"}, "podRange and serviceRange are named together"),
        (SHARED_VPC, {"podRange": "Pods", "serviceRange": "b"}, "is not a subnetwork secondary range name"),
        (
            SHARED_VPC,
            {"cluster": "ml-shared", "clusterLocation": "us-central2", "podRange": "a", "serviceRange": "b"},
            "multislice:gke.podRange: configures the cluster the stack makes",
        ),
    ],
)
def test_pod_and_service_ranges_are_refused_naming_the_key(network, gke, refused):
    values = gke_map(2, "spot") | {"multislice:gke": gke}
    if network is not None:
        values["multislice:network"] = network
    with pytest.raises(ValueError, match=refused):
        validate_stack("dev", values, "test")


def test_an_existing_cluster_on_a_shared_vpc_needs_no_ranges():
    values = gke_map(2, "spot") | {
        "multislice:network": SHARED_VPC,
        "multislice:gke": {"cluster": "ml-shared", "clusterLocation": "us-central2"},
    }
    validate_stack("dev", values, "test")  # its ranges are the cluster's own
