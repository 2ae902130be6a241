"""The policies for the gke backend's resources (:data:`GKE_POLICIES`, part of
:data:`infra.policy.policies.POLICIES`): the same security rules as the TPU VMs' on GKE's own
resource types (``gcp.container.Cluster`` and ``gcp.container.NodePool``, inputs camelCase as the
engine has them).

* ``gke-private-nodes``: a cluster's nodes have no public IP (``privateClusterConfig.enablePrivateNodes``:
  gcloud 528's ``--enable-private-nodes``, "no public IP addresses on the cluster nodes") and its control
  plane no public IP endpoint (``enablePrivateEndpoint``: the cluster "is managed using the private IP
  address of the master API endpoint"; the DNS-based endpoint, which gcloud recommends, stays reachable);
* ``gke-workload-identity``: a cluster has a workload pool (``workloadIdentityConfig.workloadPool``)
  and every node pool runs the GKE metadata server (``nodeConfig.workloadMetadataConfig.mode``
  ``GKE_METADATA``), without which Pods read the nodes' own credentials (gcloud's
  ``--workload-metadata``; docs/gke.md section 7);
* ``gke-node-service-account``: every node pool names a service account, never the Compute
  Engine default one (its Editor role: the TPU VMs' rule, ``tpu-dedicated-service-account``);
* ``gke-pod-service-account``: the Pods act as a dedicated Google service account too: every Pod
  template of a JobSet names its Kubernetes service account, never a namespace's ``default`` (which
  no stack binds), and a Kubernetes service account's ``iam.gke.io/gcp-service-account`` annotation
  (the Google service account it acts as through Workload Identity) is never the Compute Engine
  default one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from infra.backends.gke.cluster import GSA_ANNOTATION
from infra.policy.resource_types import (
    GKE_CLUSTER_TYPE,
    GKE_NODE_POOL_TYPE,
    JOBSET_TYPE,
    K8S_SERVICE_ACCOUNT_TYPE,
    Report,
    account_problem,
)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _private_nodes(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != GKE_CLUSTER_TYPE:
        return
    private = _map(args.props.get("privateClusterConfig"))
    if private.get("enablePrivateNodes") is not True:
        report(f"GKE cluster {args.name!r}: privateClusterConfig.enablePrivateNodes must be true (no public node IPs)")
    if private.get("enablePrivateEndpoint") is not True:
        report(
            f"GKE cluster {args.name!r}: privateClusterConfig.enablePrivateEndpoint must be true (no public IP "
            "endpoint; reach the control plane through its DNS-based endpoint)"
        )


def _workload_identity(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == GKE_CLUSTER_TYPE:
        if not _map(args.props.get("workloadIdentityConfig")).get("workloadPool"):
            report(f"GKE cluster {args.name!r}: workloadIdentityConfig.workloadPool must be PROJECT_ID.svc.id.goog")
    elif args.resource_type == GKE_NODE_POOL_TYPE:
        mode = _map(_map(args.props.get("nodeConfig")).get("workloadMetadataConfig")).get("mode")
        if mode != "GKE_METADATA":
            report(
                f"GKE node pool {args.name!r}: nodeConfig.workloadMetadataConfig.mode is {mode!r}, must be "
                "'GKE_METADATA' (else its Pods read the nodes' own credentials)"
            )


def _node_service_account(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != GKE_NODE_POOL_TYPE:
        return
    problem = account_problem(_map(args.props.get("nodeConfig")).get("serviceAccount"))
    if problem:
        report(f"GKE node pool {args.name!r} {problem}")


def _pod_service_account(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == K8S_SERVICE_ACCOUNT_TYPE:
        annotations = _map(_map(args.props.get("metadata")).get("annotations"))
        if GSA_ANNOTATION in annotations:
            problem = account_problem(annotations[GSA_ANNOTATION])
            if problem:
                report(f"Kubernetes service account {args.name!r} ({GSA_ANNOTATION}) {problem}")
    elif args.resource_type == JOBSET_TYPE:
        for job in _map(args.props.get("spec")).get("replicatedJobs") or []:
            pod = _map(_map(_map(_map(_map(job).get("template")).get("spec")).get("template")).get("spec"))
            account = pod.get("serviceAccountName")
            if not account or account == "default":
                report(
                    f"JobSet {args.name!r}: replicated job {_map(job).get('name')!r} runs its Pods as "
                    f"{account or 'the default'!r} Kubernetes service account; name the stack's, bound to its "
                    "Google service account"
                )


def _policy(name: str, description: str, validate: Any) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=EnforcementLevel.MANDATORY
    )


GKE_POLICIES = [
    _policy("gke-private-nodes", "GKE clusters have private nodes and a private IP endpoint.", _private_nodes),
    _policy(
        "gke-workload-identity",
        "GKE clusters have Workload Identity and their node pools the GKE metadata server.",
        _workload_identity,
    ),
    _policy(
        "gke-node-service-account",
        "GKE node pools run as a dedicated service account, never the default compute one.",
        _node_service_account,
    ),
    _policy(
        "gke-pod-service-account",
        "JobSet Pods run as a named Kubernetes service account bound to a dedicated Google one.",
        _pod_service_account,
    ),
]
