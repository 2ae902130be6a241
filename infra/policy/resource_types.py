"""The resource types the policies look at, and the callback they report to (:mod:`infra.policy.policies`)."""

from __future__ import annotations

from typing import Any, Protocol

QUEUED_RESOURCE_TYPE = "pulumi-python:dynamic/tpu:QueuedResource"
#: The compute-engine backend's instance template and its managed instance groups (infra/backends/compute_engine/).
INSTANCE_TEMPLATE_TYPE = "gcp:compute/instanceTemplate:InstanceTemplate"
INSTANCE_GROUP_TYPE = "gcp:compute/instanceGroupManager:InstanceGroupManager"
FIREWALL_TYPE = "gcp:compute/firewall:Firewall"
BUCKET_TYPE = "gcp:storage/bucket:Bucket"
#: An object the program writes to the bucket (the release record, its payload, a command's source).
BUCKET_OBJECT_TYPE = "gcp:storage/bucketObject:BucketObject"
#: pulumi-gcp's single TPU VM, held to the same node rules as the queued resource's nodes.
TPU_VM_TYPE = "gcp:tpu/v2Vm:V2Vm"
#: The gke backend's cluster and its slices' node pools (infra/backends/gke/).
GKE_CLUSTER_TYPE = "gcp:container/cluster:Cluster"
GKE_NODE_POOL_TYPE = "gcp:container/nodePool:NodePool"
#: The gke backend's Kubernetes objects (pulumi-kubernetes' type tokens).
K8S_SERVICE_ACCOUNT_TYPE = "kubernetes:core/v1:ServiceAccount"
JOBSET_TYPE = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
#: The stack's TPU resources, one of which a multislice program declares (one per backend).
TPU_PROGRAM_TYPES = (QUEUED_RESOURCE_TYPE, INSTANCE_GROUP_TYPE, GKE_NODE_POOL_TYPE)
#: pulumi-gcp's own (single-slice) queued resource.
GCP_QUEUED_RESOURCE_TYPE = "gcp:tpu/v2QueuedResource:V2QueuedResource"

PUBLIC_RANGES = ("0.0.0.0/0", "::/0")
DEFAULT_COMPUTE_SA_SUFFIX = "-compute@developer.gserviceaccount.com"
REQUIRED_LABELS = ("env", "owner", "cost-center")


class Report(Protocol):
    """The callback a validation reports a violation to: a message and, optionally, the URN of
    the resource it concerns (pulumi_policy's ``ReportViolation`` alias makes the URN a required
    positional argument, where its documentation and its callbacks make it optional)."""

    def __call__(self, message: str, urn: str | None = None, /) -> None: ...


def account_problem(email: Any) -> str | None:
    """What is wrong with the service account VMs run as (``email``, as a resource names it): none
    named, or the Compute Engine default one (its Editor role); None for a dedicated one. The text
    follows the resource's name in a violation."""
    if not email:
        return "names no service account: its VMs would run as the Compute Engine default service account"
    if str(email).endswith(DEFAULT_COMPUTE_SA_SUFFIX):
        return f"runs as the Compute Engine default service account {email}; use a dedicated, least-privilege one"
    return None
