"""The names a gke stack's objects get, each a function of the stack (the operator commands find
them without the stack's outputs).

A new cluster is ``multislice-<stack>`` (at most 40 characters, a GKE cluster name); the
node pools are the queued resource's node ids (``config.node_ids``, one per slice); the JobSet is
``multislice-<stack>`` too, so every Pod's hostname ``<jobset>-slice-<j>-<p>`` stays well inside a
63-character DNS label; the Pods' Kubernetes service account is ``multislice-<stack>-trainer``.
"""

from __future__ import annotations

from typing import Any

from infra.naming import label_value

StackConfig = Any  # infra.config.StackConfig (read by attribute)


def context_name(project: str, location: str, cluster: str) -> str:
    """gcloud's kubeconfig context name for a cluster (gcloud 528's ``util.py``, ``KUBECONTEXT_FORMAT``)."""
    return f"gke_{project}_{location}_{cluster}"


def cluster_name(config: StackConfig) -> str:
    """The cluster the node pools go to: ``multislice:gke.cluster``, else the stack's own."""
    return config.gke.cluster or config.resource_prefix


def cluster_location(config: StackConfig) -> str:
    """The cluster's zone or region: ``multislice:gke.clusterLocation``, else the stack's zone (its
    region with ``multislice:gke.regional``)."""
    if config.gke.cluster_location:
        return config.gke.cluster_location
    return config.zone.rsplit("-", 1)[0] if config.gke.regional else config.zone


def jobset_name(config: StackConfig) -> str:
    """The run's JobSet (see the module docstring)."""
    return config.resource_prefix


def kubernetes_service_account(config: StackConfig) -> str:
    """The Pods' Kubernetes service account."""
    return f"{config.resource_prefix}-trainer"


def kube_context(config: StackConfig) -> str:
    """The kubeconfig context ``gcloud container clusters get-credentials`` writes for the cluster."""
    return context_name(config.project, cluster_location(config), cluster_name(config))


def pod_label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: its GCP label value (:func:`infra.naming.label_value`)
    without the ``-`` and ``_`` at its ends, which Kubernetes refuses (a value begins and ends with a
    letter or digit: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/).
    A run name may end in ``-`` (``multislice:runName``); stack and run names begin with a letter or
    digit, so the value is never empty."""
    return label_value(text).strip("-_")


def pod_labels(config: StackConfig) -> dict[str, str]:
    """The labels every Pod carries besides JobSet's: the stack and the run (Cloud Logging copies a
    Pod's labels into its entries as ``k8s-pod/<key>``: :mod:`~infra.backends.gke.logs`)."""
    return {
        "multislice-stack": pod_label_value(config.stack),
        "multislice-run": pod_label_value(config.effective_run_name),
    }
