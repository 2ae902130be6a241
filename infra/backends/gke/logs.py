"""The gke backend's Cloud Logging filters.

A Pod's stdout and stderr are ``k8s_container`` entries, whose resource labels name the project,
the location, the cluster, the namespace, the Pod and the container ([Google] docs/gke.md section
8). GKE copies a Pod's Kubernetes labels into the entry's labels as ``k8s-pod/<key>``, with the dots
of a key's prefix written as underscores ([third-party]: maintained filters such as
GoogleCloudPlatform/ml-auto-solutions' ``labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"``, and
others reading ``k8s-pod/jobset_sigs_k8s_io/job-index`` and
``k8s-pod/batch_kubernetes_io/job-completion-index``; no Google page read states the rule, so it is
docs/gke.md's section 8, marked third-party). The stack's trainer lines are therefore told by the
run's Pod label ``multislice-run`` (:func:`~infra.backends.gke.names.pod_labels`), a slice by
JobSet's ``job-index`` label and a worker by the Indexed Job's completion index.
"""

from __future__ import annotations

from datetime import datetime

from infra.backends.gke import names
from infra.backends.gke.jobset import CONTAINER, JOB_INDEX_LABEL
from infra.backends.gke.operate import COMPLETION_INDEX_LABEL
from infra.backends.log_query import narrowed

#: ``resource.type`` of a container's entries.
K8S_CONTAINER = "k8s_container"


def entry_label(pod_label: str) -> str:
    """The entry label Cloud Logging gives Pod label ``pod_label`` (see the module docstring)."""
    prefix, slash, name = pod_label.rpartition("/")
    return f"k8s-pod/{prefix.replace('.', '_')}{slash}{name}"


def gke_filter(config, run: str | None = None) -> str:
    """The trainer container's lines of run ``run`` (default: the stack's run name) in the stack's
    cluster and namespace."""
    run_label = names.pod_label_value(run if run is not None else config.effective_run_name)
    return " AND ".join(
        (
            f'resource.type="{K8S_CONTAINER}"',
            f'resource.labels.project_id="{config.project}"',
            f'resource.labels.cluster_name="{names.cluster_name(config)}"',
            f'resource.labels.namespace_name="{config.gke.namespace}"',
            f'resource.labels.container_name="{CONTAINER}"',
            f'labels."{entry_label("multislice-run")}"="{run_label}"',
        )
    )


def trainer_filter(
    config,
    *,
    slice_id: int | None = None,
    worker: int | None = None,
    since: datetime | None = None,
    run: str | None = None,
) -> str:
    """The trainer's lines of run ``run`` of one slice (its Pods' ``job-index``) and/or one worker
    (their completion index), at or after ``since``.

    Raises:
      IndexError: ``slice_id`` is not a slice of the stack.
    """
    return narrowed(
        gke_filter(config, run),
        config.slices,
        slice_id=slice_id,
        worker=worker,
        since=since,
        slice_clause=lambda s: f'labels."{entry_label(JOB_INDEX_LABEL)}"="{s}"',
        worker_clause=lambda w: f'labels."{entry_label(COMPLETION_INDEX_LABEL)}"="{w}"',
    )
