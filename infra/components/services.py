"""The Google APIs a fresh project needs before anything else can be created."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from training.validation import StrictModel

#: APIs this program uses: the TPU API (queued resources), Compute Engine (VPC, firewall,
#: NAT; TPU VMs run on it), Cloud Storage (checkpoints), IAM (the VMs' service account),
#: Resource Manager (project IAM bindings), and Logging/Monitoring (what the VMs write).
REQUIRED_APIS = (
    "tpu.googleapis.com",
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
    apis: tuple[str, ...] = REQUIRED_APIS


class ProjectServices(pulumi.ComponentResource):
    """Enables ``args.apis`` (:data:`REQUIRED_APIS` by default) on ``args.project``.

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
