"""The gke backend's operator commands, as the argument lists of gcloud and kubectl that do them.

* **Credentials**: ``gcloud container clusters get-credentials CLUSTER --location L --project P
  --dns-endpoint`` writes the kubeconfig entry of :func:`~infra.backends.gke.workload.kubeconfig`
  (context ``gke_P_L_CLUSTER``); every kubectl command here names that context.
* **The run's Pods**: ``kubectl get pods`` by the label JobSet puts on every Pod,
  ``jobset.sigs.k8s.io/jobset-name`` (docs/gke.md section 5); :func:`pods_of` reads the listing into
  (slice, worker) places from the labels ``jobset.sigs.k8s.io/job-index`` (the slice) and
  ``batch.kubernetes.io/job-completion-index`` (the Pod's index in its Indexed Job: the worker; a label
  from Kubernetes 1.28, an annotation in every version: Kubernetes' Job documentation, "Completion mode").
* **exec**: ``kubectl exec POD --container trainer -- COMMAND`` on each Pod.
* **reset**: no restart verb is documented for a JobSet (docs/gke.md, question 8); ``spec.suspend``
  is (JobSet's API: it suspends every child Job, and a suspended Job's running Pods are deleted,
  Kubernetes' "Job suspension"), so a reset suspends the JobSet and resumes it
  (:func:`suspend_command` twice): every Pod starts again and resumes from the newest checkpoint.
* **logs**: the ``k8s_container`` entries of the run's Pods (:func:`log_filter`, docs/gke.md section 8).

Each list is checked against the installed kubectl and gcloud in tests/backends/gke/test_operate.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.backends.gke.jobset import CONTAINER, JOB_INDEX_LABEL

#: The label JobSet puts on every Job and Pod it makes, valued with the JobSet's name.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Kubernetes' label (1.28+) and annotation of an Indexed Job's Pod: its completion index.
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class PodListingError(ValueError):
    """``kubectl get pods -o json`` answered something that is not a listing of the run's Pods."""


@dataclass(frozen=True, order=True)
class PodPlace:
    """One Pod of the run: its slice (child Job index), its worker (index within the slice), its
    name and its phase (``Pending``, ``Running``, ``Succeeded``, ``Failed``, ``Unknown``)."""

    slice_id: int
    worker: int
    name: str
    phase: str


def credentials_command(*, project: str, location: str, cluster: str) -> list[str]:
    """gcloud's command that writes the cluster's kubeconfig entry (its DNS-based endpoint)."""
    return [
        "gcloud",
        "container",
        "clusters",
        "get-credentials",
        cluster,
        "--location",
        location,
        "--project",
        project,
        "--dns-endpoint",
    ]


def kubectl(context: str, namespace: str, *args: str) -> list[str]:
    """kubectl with ``args`` in ``namespace`` of the cluster of kubeconfig context ``context``."""
    return ["kubectl", "--context", context, "--namespace", namespace, *args]


def pods_command(*, context: str, namespace: str, jobset: str) -> list[str]:
    """kubectl's listing of the run's Pods, as JSON."""
    return kubectl(
        context,
        namespace,
        "get",
        "pods",
        "--selector",
        f"{JOBSET_NAME_LABEL}={jobset}",
        "--output",
        "json",
    )


def exec_command(*, context: str, namespace: str, pod: str, command: Sequence[str]) -> list[str]:
    """kubectl's ``command`` in the trainer container of ``pod``.

    Raises:
      ValueError: ``command`` is empty.
    """
    if not command:
        raise ValueError("exec needs a command to run in the Pod")
    return kubectl(context, namespace, "exec", pod, "--container", CONTAINER, "--", *command)


def suspend_command(*, context: str, namespace: str, jobset: str, suspend: bool) -> list[str]:
    """kubectl's patch of the JobSet's ``spec.suspend``."""
    patch = json.dumps({"spec": {"suspend": suspend}}, separators=(",", ":"))
    return kubectl(context, namespace, "patch", "jobset", jobset, "--type", "merge", "--patch", patch)


def log_filter(*, cluster: str, namespace: str, jobset: str) -> str:
    """The Cloud Logging filter of the run's container lines (docs/gke.md section 8: a prefix match
    on the Pods' names, which all start with the JobSet's)."""
    return (
        f'resource.type="k8s_container" AND resource.labels.cluster_name="{cluster}" AND '
        f'resource.labels.namespace_name="{namespace}" AND resource.labels.pod_name:"{jobset}-"'
    )


def pods_of(listing: str, jobset: str) -> list[PodPlace]:
    """The run's Pods from ``kubectl get pods -o json`` (:func:`pods_command`), by slice and worker.

    Raises:
      PodListingError: not JSON, not a Kubernetes ``List``, or a Pod of the JobSet without its slice
        or worker index, or two Pods in one place (named in the message).
    """
    from training.run_objects import json_record  # jax-free; here, not above: the program never imports it

    try:
        answer = json_record(listing.encode())  # 64 MiB, nesting bounded: else a ValueError
    except ValueError as err:
        raise PodListingError(f"kubectl's Pod listing is not JSON ({err})") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("items"), list):
        raise PodListingError("kubectl's Pod listing has no 'items' list")
    places: dict[tuple[int, int], PodPlace] = {}
    for item in answer["items"]:
        metadata: dict[str, Any] = (item.get("metadata") if isinstance(item, dict) else None) or {}
        labels = metadata.get("labels") or {}
        if labels.get(JOBSET_NAME_LABEL) != jobset:
            continue
        name = str(metadata.get("name", "?"))
        # The completion index: a label from Kubernetes 1.28, an annotation before (Kubernetes' "Indexed Job").
        annotations = metadata.get("annotations") or {}
        try:
            place = (
                int(labels[JOB_INDEX_LABEL]),
                int(labels.get(COMPLETION_INDEX_LABEL, annotations.get(COMPLETION_INDEX_LABEL, ""))),
            )
        except (KeyError, TypeError, ValueError):
            raise PodListingError(
                f"Pod {name} of JobSet {jobset} has no integer {JOB_INDEX_LABEL} and {COMPLETION_INDEX_LABEL} labels"
            ) from None
        if place in places:
            raise PodListingError(f"Pods {places[place].name} and {name} both claim slice {place[0]} worker {place[1]}")
        phase = str((item.get("status") or {}).get("phase", "Unknown"))
        places[place] = PodPlace(place[0], place[1], name, phase)
    return sorted(places.values())
