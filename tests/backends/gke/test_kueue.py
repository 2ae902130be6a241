"""All slices or none on GKE (``multislice:gke.queuedProvisioning``, infra.backends.gke.kueue), under Pulumi's
mocks: the program installs Kueue's release in the cluster it makes (read and held to that release in an
existing one), declares the queues Cluster Toolkit's ``dws-flex-start-queued-provisioning`` TPU blueprints
declare, each one Kueue v0.17.1's CRD accepts (tests/data/kueue-v0.17.1), labels, annotates and node-selects
the JobSet as the blueprints' TPU test JobSets are, and asks for queued provisioning on every TPU pool. The
key is refused beside any capacity but flex-start, in one line naming it, and ``plan`` says of a multi-slice
flex-start stack without it that its slices may wait billed for each other."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra.backends.gke import kueue, kueue_controller
from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.slices import GkeSlices
from infra.config import validate_stack
from infra.planner import plan
from infra.policy.evaluate import check_world
from infra.review.program_mocks import declare
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import ce_map
from tests.helpers.gke import gke_inputs
from tests.helpers.openapi_schema import problems

DATA = Path(__file__).parents[2] / "data"
KUEUE_SCHEMAS = json.loads((DATA / "kueue-v0.17.1" / "openapi-v3-schemas.json").read_text())
JOBSET_SCHEMA = json.loads((DATA / "jobset-v0.10.1" / "openapi-v3-schema.json").read_text())
KINDS = ("ResourceFlavor", "ProvisioningRequestConfig", "AdmissionCheck", "ClusterQueue", "LocalQueue")
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
POOL = "gcp:container/nodePool:NodePool"
QUEUED = "cloud.google.com/gke-queued"


def flex_start(slices: int = 2, **gke: Any) -> dict[str, Any]:
    """v6e-16 slices (4 VMs of 4 chips) on flex-start, on gke, with ``multislice:gke`` ``gke``."""
    values = ce_map("v6e-16", slices=slices, capacity="flex-start") | {"multislice:backend": "gke"}
    return values | ({"multislice:gke": gke} if gke else {})


def wire(value: Any) -> Any:
    """A registration's inputs as the API server reads them: Pulumi's mocks carry every number as a float
    (a protobuf Struct), which JSON writes as the whole number it is."""
    if isinstance(value, dict):
        return {key: wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [wire(item) for item in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def queued_objects(world) -> dict[str, Any]:
    """Kind -> the one Kueue object of that kind the program declared."""
    found = {}
    for kind in KINDS:
        (registered,) = world.of(f"kubernetes:kueue.x-k8s.io/v1beta2:{kind}")
        found[kind] = registered
    return found


@pytest.fixture(scope="module")
def queued():
    return evaluate("dev", flex_start(queuedProvisioning=True, maxRunDuration="3d"))


def test_a_queued_stack_installs_kueue_after_jobset_and_declares_the_blueprints_queues(queued):
    jobset_controller, kueue_controller = sorted(queued.of(CONFIG_FILE), key=lambda r: r.name)
    assert (jobset_controller.name, kueue_controller.name) == ("jobset-controller", "kueue-controller")
    assert kueue_controller.inputs["file"] == (
        "https://github.com/kubernetes-sigs/kueue/releases/download/v0.17.1/manifests.yaml"
    )
    assert jobset_controller.urn in kueue_controller.dependencies  # its JobSet integration needs JobSet's CRD
    objects = queued_objects(queued)
    for kind, registered in objects.items():  # each one Kueue v0.17.1 accepts whole
        assert problems(KUEUE_SCHEMAS[kind], wire(registered.inputs)) == [], kind
        assert kueue_controller.urn in registered.dependencies
    name = "multislice-dev"
    assert objects["ResourceFlavor"].inputs["spec"] == {
        "nodeLabels": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
        "tolerations": [{"key": "google.com/tpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
    }
    assert objects["ProvisioningRequestConfig"].inputs["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io",
        "managedResources": ["google.com/tpu"],
        "parameters": {"tpu-topology": "4x4"},
    }
    assert objects["AdmissionCheck"].inputs["spec"] == {
        "controllerName": "kueue.x-k8s.io/provisioning-request",
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": name},
    }
    cluster_queue = objects["ClusterQueue"].inputs["spec"]
    # The blueprint's quota: slices × VMs × chips per VM (2 × 4 × 4), the flavor behind the admission check.
    (group,) = cluster_queue["resourceGroups"]
    assert group["flavors"] == [{"name": name, "resources": [{"name": "google.com/tpu", "nominalQuota": 32}]}]
    assert cluster_queue["admissionChecksStrategy"] == {"admissionChecks": [{"name": name, "onFlavors": [name]}]}
    assert objects["LocalQueue"].inputs["metadata"] == {"name": name, "namespace": "default"}
    assert objects["LocalQueue"].inputs["spec"] == {"clusterQueue": name}
    assert [v for v in check_world(queued) if v.mandatory] == []


def test_the_jobset_is_labelled_annotated_and_node_selected_as_the_blueprints_tpu_jobsets(queued):
    run = queued.one(JOBSET)
    metadata = run.inputs["metadata"]
    assert metadata["labels"] == {"kueue.x-k8s.io/queue-name": "multislice-dev"}  # the LocalQueue
    assert metadata["annotations"]["provreq.kueue.x-k8s.io/maxRunDurationSeconds"] == str(3 * 24 * 3600)
    (replicated,) = run.inputs["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"][QUEUED] == "true"
    assert {"key": QUEUED, "operator": "Equal", "value": "true", "effect": "NoSchedule"} in pod["tolerations"]
    assert problems(JOBSET_SCHEMA, wire(run.inputs)) == []
    # Kueue and every queue before the JobSet: Kueue's webhook holds it suspended until admitted.
    assert {r.urn for r in queued_objects(queued).values()} <= set(run.dependencies)


def test_every_tpu_pool_asks_for_queued_provisioning(queued):
    pools = [pool for pool in queued.of(POOL) if pool.name != "system"]
    assert len(pools) == 2
    for pool in pools:  # Cluster Toolkit's gke-node-pool: enabled, its nodes labelled; flex-start from 0
        assert pool.inputs["queuedProvisioning"] == {"enabled": True}
        node_config = pool.inputs["nodeConfig"]
        assert node_config["labels"] == {QUEUED: "true"} and node_config["flexStart"] is True
        assert node_config["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
        assert pool.inputs["autoscaling"]["minNodeCount"] == 0


def test_without_the_key_a_flex_start_stack_has_no_kueue_and_no_queue():
    world = evaluate("dev", flex_start())
    assert [r.typ for r in world.registrations if "kueue" in r.typ] == []
    assert [r.name for r in world.of(CONFIG_FILE)] == ["jobset-controller"]
    assert "labels" not in world.one(JOBSET).inputs["metadata"]
    assert all("queuedProvisioning" not in pool.inputs for pool in world.of(POOL))


def test_an_existing_cluster_s_kueue_is_read_and_the_queues_are_the_stack_s_own():
    shared = {"cluster": "ml-shared", "clusterLocation": "us-east5", "queuedProvisioning": True}
    world = evaluate("dev", flex_start(**shared) | {"gcp:zone": "us-east5-b"})
    assert world.of(CONFIG_FILE) == []  # neither JobSet's controller nor Kueue: the cluster's own
    reads = sorted(read for read in world.reads if read[0] == "kubernetes:apps/v1:Deployment")
    assert reads == [
        ("kubernetes:apps/v1:Deployment", "jobset-system/jobset-controller-manager"),
        ("kubernetes:apps/v1:Deployment", "kueue-system/kueue-controller-manager"),
    ]
    assert sorted(queued_objects(world)) == sorted(KINDS)
    assert world.one(JOBSET).inputs["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "multislice-dev"}


def kueue_spec(image: str) -> dict[str, Any]:
    return {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}}


def test_an_existing_cluster_s_older_kueue_is_refused_in_one_line_naming_the_key(monkeypatch):
    with pytest.raises(kueue_controller.KueueControllerError) as caught:
        kueue_controller.check_kueue_controller(kueue_spec("registry.k8s.io/kueue/kueue:v0.14.2"), "ml-shared")
    message = str(caught.value)
    assert (
        message.startswith(
            "multislice:gke.cluster: cluster ml-shared runs Kueue v0.14.2 (kueue-system/kueue-controller-manager), "
            "below v0.17.1, which the stack's queues (multislice:gke.queuedProvisioning) are written for"
        )
        and "\n" not in message
    )
    kueue_controller.check_kueue_controller(kueue_spec("registry.k8s.io/kueue/kueue:v0.19.2"), "ml-shared")
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", warned.append)
    # A build of their own: taken, with a warning.
    kueue_controller.check_kueue_controller(kueue_spec("us-docker.pkg.dev/team/kueue:dev"), "ml-shared")
    assert len(warned) == 1 and "not a release" in warned[0]
    assert "; action needed if that build predates v0.17.1: upgrade it there, or leave multislice:gke" in warned[0]


@pytest.mark.parametrize("capacity", ["spot", "on-demand", "reserved"])
def test_the_key_is_refused_beside_any_capacity_but_flex_start_in_one_line(capacity):
    values = ce_map("v6e-16", capacity=capacity) | {
        "multislice:backend": "gke",
        "multislice:gke": {"queuedProvisioning": True},
    }
    if capacity == "reserved":
        values["multislice:reservationName"] = "tpu-pool"
    with pytest.raises(ValueError) as caught:
        validate_stack("dev", values, "test")
    (line,) = [line.strip() for line in str(caught.value).splitlines() if "queuedProvisioning" in line]
    assert line == (
        "multislice:gke.queuedProvisioning: asks for every slice's flex-start capacity at once (GKE's queued "
        f"provisioning, through Kueue), and multislice:capacity is {capacity}: set multislice:capacity: flex-start, "
        "or remove it"
    )
    # The component refuses it too, before any resource is registered.
    registered: list[Any] = []
    inputs = gke_inputs(capacity=capacity, settings=GkeSettings.model_validate({"queuedProvisioning": True}))
    with pytest.raises(ValueError, match="^multislice:gke.queuedProvisioning: asks for every slice's"):
        registered.append(declare(lambda: GkeSlices("slices", inputs)))
    assert registered == []


def test_a_queue_the_stack_does_not_declare_is_refused():
    jobset = {"metadata": {"name": "dev", "namespace": "ml"}, "spec": {"replicatedJobs": []}}
    objects = tuple(kueue.queue_objects(name="dev", namespace="ml", shape=gke_inputs().shape, slices=2))
    with pytest.raises(ValueError, match="carries no kueue.x-k8s.io/queue-name label"):
        kueue.check_queues(jobset, objects)
    labelled = kueue.queued_jobset(jobset, queue="other", max_run_duration_s=600)
    with pytest.raises(ValueError, match="in LocalQueue 'other', which the stack does not declare in 'ml'"):
        kueue.check_queues(labelled, objects)
    kueue.check_queues(kueue.queued_jobset(jobset, queue="dev", max_run_duration_s=600), objects)
    kueue.check_queues(jobset, ())  # not queued, no queues


def test_the_blueprints_admission_checks_field_is_one_kueue_v0_17_1_prunes(queued):
    # Cluster Toolkit v1.95.0's tpu-dws-queues.yaml.tftpl lists the check under spec.admissionChecks, which
    # Kueue's v1beta2 removed (CHANGELOG-0.15, #7490): the stack writes admissionChecksStrategy instead.
    cluster_queue = wire(copy.deepcopy(queued_objects(queued)["ClusterQueue"].inputs))
    del cluster_queue["spec"]["admissionChecksStrategy"]
    cluster_queue["spec"]["admissionChecks"] = ["multislice-dev"]
    assert problems(KUEUE_SCHEMAS["ClusterQueue"], cluster_queue) == [
        "spec.admissionChecks: unknown field (the API server would prune it)"
    ]


WAIT = "slices may wait billed for each other"


@pytest.mark.parametrize(
    ("slices", "gke", "waits"),
    [(2, {}, True), (1, {}, False), (2, {"queuedProvisioning": True}, False)],
    ids=["several slices without it", "one slice", "with it"],
)
def test_plan_says_when_slices_may_wait_billed_for_each_other(slices, gke, waits):
    line = plan(validate_stack("dev", flex_start(slices, **gke), "test")).capacity or ""
    assert (WAIT in line) is waits, line
    if waits:
        assert "(multislice:gke.queuedProvisioning: true asks for every slice at once)" in line
    if gke:
        assert "one ProvisioningRequest for every slice is granted (queued provisioning: all slices or none)" in line
