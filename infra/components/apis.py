"""The Google APIs a stack enables: those every stack uses (:data:`COMMON_APIS`) and those its
backend's own resources need (:attr:`infra.backends.spec.BackendSpec.apis`). No Pulumi here:
``multislice plan`` lists them (:mod:`infra.planner`) without importing what enables them
(:class:`infra.components.services.ProjectServices`)."""

from __future__ import annotations


def apis_for(backend_apis: tuple[str, ...]) -> tuple[str, ...]:
    """The APIs a stack enables: :data:`COMMON_APIS`, then its backend's ``backend_apis``."""
    return tuple(dict.fromkeys(COMMON_APIS + backend_apis))


#: The APIs every stack uses, whatever its backend: Compute Engine (VPC, firewall, NAT; every TPU VM
#: and node runs on it), Cloud Storage (checkpoints, the release record), IAM (the VMs' service
#: account), Resource Manager (project IAM bindings), and Logging/Monitoring (what the VMs write).
#: A backend adds its own (``BackendSpec.apis``: the Cloud TPU API for a queued resource, the GKE API
#: for a cluster).
COMMON_APIS = (
    "compute.googleapis.com",
    "storage.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
)
