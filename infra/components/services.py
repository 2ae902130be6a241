"""The Google APIs a fresh project needs before anything else can be created, enabled: which
they are is :mod:`infra.components.apis` (:func:`~infra.components.apis.apis_for`)."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.components.apis import COMMON_APIS
from training.validation import StrictModel


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
