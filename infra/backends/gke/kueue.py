"""All slices or none: ``multislice:gke.queuedProvisioning`` asks for every slice's flex-start capacity at
once, through Kueue and GKE's queued provisioning (docs/gke.md section 3).

Without it each flex-start pool scales up on its own when the JobSet's Pods ask, so the slices arrive one
by one: those that come first are billed, and their maximum run duration runs, while they wait for the
others. With it:

* **The pools** ([Google] Cluster Toolkit's ``modules/compute/gke-node-pool`` at v1.95.0, 1047080, which its
  ``dws-flex-start-queued-provisioning`` TPU blueprints use): ``queued_provisioning.enabled`` beside flex-start
  (autoscaled from 0, ``NO_RESERVATION``: :mod:`~infra.backends.gke.node_pools`), and the node label
  :data:`QUEUED_LABEL` ``"true"`` ("while GKE automatically applies the taint, the label is required for
  workloads using nodeSelectors"). The Container API's ``QueuedProvisioning.enabled``: nodes "can be only
  obtained through queuing via the Cluster Autoscaler ProvisioningRequest API".
* **Kueue** ([third-party] kubernetes-sigs/kueue, the release :data:`~infra.backends.gke.cluster.KUEUE_VERSION`):
  installed as its installation page says, ``kubectl apply --server-side -f`` the release's ``manifests.yaml``
  (:data:`MANIFESTS_URL`), in a cluster the stack makes, as the JobSet controller is; an existing cluster's is
  read and held to that release (:mod:`~infra.backends.gke.kueue_controller`, which declares what this
  module describes: this one imports no Pulumi, for the commands that read a stack's settings). Its JobSet
  integration is on by default (``integrations.frameworks`` lists ``jobset.x-k8s.io/jobset``).
* **The queues** (:func:`queue_objects`), as Cluster Toolkit's ``dws-flex-start-queued-provisioning/
  tpu-dws-queues.yaml.tftpl`` declares them: a ResourceFlavor of the slices' accelerator tolerating the TPU
  taint; an AdmissionCheck whose controller is :data:`ADMISSION_CHECK_CONTROLLER` and whose parameters name a
  ProvisioningRequestConfig of class :data:`PROVISIONING_CLASS` managing ``google.com/tpu`` with the slices'
  ``tpu-topology``; a ClusterQueue whose TPU quota is the blueprint's (slices × VMs × chips per VM) and whose
  flavor needs that check; a LocalQueue in the JobSet's namespace. One difference: the blueprint lists the
  check under ``spec.admissionChecks``, which Kueue's ``v1beta2`` API removed ("remove deprecated
  .spec.admissionChecks field from ClusterQueue API in favor of .spec.admissionChecksStrategy", its
  CHANGELOG-0.15, #7490); the stack writes ``admissionChecksStrategy`` (checked against the release's CRDs:
  tests/backends/gke/test_kueue.py).
* **The JobSet** (:func:`queued_jobset`), as the blueprints' ``tpu-v6e-test-job.yaml`` and
  ``tpu-7x-test-job.yaml``: labelled :data:`QUEUE_LABEL` with the LocalQueue, annotated
  :data:`MAX_RUN_DURATION_ANNOTATION` ("Required for DWS Flex / Queued Provisioning"; Kueue passes every
  ``provreq.kueue.x-k8s.io/`` annotation to the ProvisioningRequest as a parameter) with the stack's
  ``multislice:gke.maxRunDuration`` in seconds (GKE's seven days when unset), and its Pods select and
  tolerate :data:`QUEUED_LABEL` ("Mandatory for Queued Provisioning"). Kueue holds the JobSet suspended
  until the one ProvisioningRequest of its Workload, every slice's Pods, is provisioned; then every Pod
  starts.
"""

from __future__ import annotations

import copy
from typing import Any

from infra.backends.gke.cluster import KUEUE_VERSION, MAX_RUN_DURATION_S
from infra.backends.gke.node_pools import ACCELERATOR_LABEL, TPU_RESOURCE, TPU_TOLERATION, NodePoolShape

API_VERSION = "kueue.x-k8s.io/v1beta2"
#: The label that puts a JobSet in a LocalQueue (Kueue's ``pkg/controller/constants``: ``QueueLabel``).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The annotation whose value the ProvisioningRequest gets as ``maxRunDurationSeconds`` (Kueue's
#: ``ProvReqAnnotationPrefix`` ``provreq.kueue.x-k8s.io/``).
MAX_RUN_DURATION_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
#: The node label (and taint key) of a queued-provisioning pool, and the toleration its Pods carry.
QUEUED_LABEL = "cloud.google.com/gke-queued"
QUEUED_TOLERATION = {"key": QUEUED_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
#: Kueue's ProvisioningRequest admission check, and GKE's queued-provisioning class.
ADMISSION_CHECK_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
PROVISIONING_CLASS = "queued-provisioning.gke.io"
#: Kueue's release manifests ("Install by kubectl", its ``site/content/en/docs/installation/_index.md``).
MANIFESTS_URL = "https://github.com/kubernetes-sigs/kueue/releases/download/{version}/manifests.yaml"


def manifests_url(version: str = KUEUE_VERSION) -> str:
    """The release asset Kueue is installed from."""
    return MANIFESTS_URL.format(version=version)


def capacity_refusal(queued: bool, capacity: str) -> str | None:
    """Why ``multislice:gke.queuedProvisioning`` cannot go with ``multislice:capacity`` (None: it can). Queued
    provisioning obtains flex-start capacity (GKE's "flex-start with queued provisioning": both flags on the pool;
    Cluster Toolkit refuses it with Spot and with any reservation affinity but ``NO_RESERVATION``)."""
    if not queued or capacity == "flex-start":
        return None
    return (
        "asks for every slice's flex-start capacity at once (GKE's queued provisioning, through Kueue), and "
        f"multislice:capacity is {capacity}: set multislice:capacity: flex-start, or remove it"
    )


def pool_args(queued: bool) -> dict[str, Any]:
    """What a TPU pool adds for queued provisioning (pulumi-gcp ``NodePool`` args): ``queued_provisioning``
    (module docstring); nothing without it."""
    return {"queued_provisioning": {"enabled": True}} if queued else {}


def node_labels(queued: bool) -> dict[str, str]:
    """The Kubernetes labels of a queued-provisioning pool's nodes (``node_config.labels``)."""
    return {QUEUED_LABEL: "true"} if queued else {}


def run_duration_s(max_run_duration: int | None) -> int:
    """The annotation's seconds: ``multislice:gke.maxRunDuration``, else GKE's seven days."""
    return max_run_duration if max_run_duration is not None else MAX_RUN_DURATION_S


def queued_jobset(jobset: dict[str, Any], *, queue: str, max_run_duration_s: int) -> dict[str, Any]:
    """A copy of ``jobset`` in LocalQueue ``queue`` (module docstring): labelled, annotated with the
    nodes' run duration, its Pods selecting and tolerating the queued pools' label and taint."""
    made = copy.deepcopy(jobset)
    metadata = made["metadata"]
    metadata["labels"] = {**metadata.get("labels", {}), QUEUE_LABEL: queue}
    metadata["annotations"] = {**metadata.get("annotations", {}), MAX_RUN_DURATION_ANNOTATION: str(max_run_duration_s)}
    for replicated in made["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]["spec"]
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), QUEUED_LABEL: "true"}
        pod["tolerations"] = [*pod.get("tolerations", []), dict(QUEUED_TOLERATION)]
    return made


def queue_of(jobset: dict[str, Any]) -> str | None:
    """The LocalQueue a JobSet is labelled with (None: not queued)."""
    return (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL)


def queue_objects(*, name: str, namespace: str, shape: NodePoolShape, slices: int) -> list[dict[str, Any]]:
    """The Kueue objects of one stack, each named ``name`` (module docstring): ResourceFlavor,
    ProvisioningRequestConfig, AdmissionCheck, ClusterQueue (cluster-scoped), then the LocalQueue in
    ``namespace``, in the order they may be created."""

    def made(kind: str, spec: dict[str, Any], **metadata: str) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name, **metadata}, "spec": spec}

    group = API_VERSION.split("/", 1)[0]
    quota = slices * shape.node_count * shape.chips_per_node
    return [
        made(
            "ResourceFlavor",
            {"nodeLabels": {ACCELERATOR_LABEL: shape.accelerator}, "tolerations": [dict(TPU_TOLERATION)]},
        ),
        made(
            "ProvisioningRequestConfig",
            {
                "provisioningClassName": PROVISIONING_CLASS,
                "managedResources": [TPU_RESOURCE],
                "parameters": {"tpu-topology": shape.topology},
            },
        ),
        made(
            "AdmissionCheck",
            {
                "controllerName": ADMISSION_CHECK_CONTROLLER,
                "parameters": {"apiGroup": group, "kind": "ProvisioningRequestConfig", "name": name},
            },
        ),
        made(
            "ClusterQueue",
            {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [TPU_RESOURCE],
                        "flavors": [{"name": name, "resources": [{"name": TPU_RESOURCE, "nominalQuota": quota}]}],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": name, "onFlavors": [name]}]},
            },
        ),
        made("LocalQueue", {"clusterQueue": name}, namespace=namespace),
    ]


def check_queues(jobset: dict[str, Any], queues: tuple[dict[str, Any], ...]) -> None:
    """Refuse a JobSet whose queue label and the stack's queues disagree: labelled without a LocalQueue of
    that name in its namespace, or queues without the label (it would run outside them).

    Raises:
      ValueError: naming the queue.
    """
    queue = queue_of(jobset)
    local = [q["metadata"] for q in queues if q["kind"] == "LocalQueue"]
    if queue is None and queues:
        raise ValueError(f"the JobSet carries no {QUEUE_LABEL} label, and the stack declares Kueue's queues")
    namespace = jobset["metadata"]["namespace"]
    if queue is not None and {"name": queue, "namespace": namespace} not in local:
        raise ValueError(f"the JobSet is in LocalQueue {queue!r}, which the stack does not declare in {namespace!r}")
