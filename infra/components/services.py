"""The Google APIs a fresh project needs before anything else can be created: those every stack
uses (:data:`COMMON_APIS`) and those its backend's own resources need
(:attr:`infra.backends.spec.BackendSpec.apis`)."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from training.validation import StrictModel


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


class ServicesArgs(StrictModel):
    """What :class:`ProjectServices` needs: the project and the APIs to enable."""

    project: str
    apis: tuple[str, ...] = COMMON_APIS


class ProjectServices(pulumi.ComponentResource):
    """Enables ``args.apis`` (:data:`COMMON_APIS` by default) on ``args.project``.

    Other components take this as a ``depends_on`` so a fresh project converges in one
    ``pulumi up``. Destroying the stack leaves the APIs enabled (``disable_on_destroy=False``):
    other workloads of the project may use them.

    Attributes:
      services: service name -> ``gcp.projects.Service``.
    """

    def __init__(self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("multislice:gcp:ProjectServices", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.services = {
            api: gcp.projects.Service(
                f"{name}-{api.split('.')[0]}",
                project=args.project,
                service=api,
                disable_on_destroy=False,
                disable_dependent_services=False,
                opts=child,
            )
            for api in args.apis
        }
        self.register_outputs({"services": list(self.services)})
