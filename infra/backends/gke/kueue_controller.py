"""Kueue in the cluster and the stack's queues as Kubernetes objects (``multislice:gke.queuedProvisioning``):
Kueue's release manifests applied in a cluster the stack makes, an existing cluster's Kueue read and held to
:data:`~infra.backends.gke.cluster.KUEUE_VERSION` (:func:`check_kueue_controller`), then each object of
:func:`~infra.backends.gke.kueue.queue_objects` (:func:`declare`). What they are and their sources:
:mod:`infra.backends.gke.kueue`."""

from __future__ import annotations

import re
from typing import Any

import pulumi

from infra.backends.gke.cluster import KUEUE_VERSION
from infra.backends.gke.kueue import manifests_url
from training.warning_text import act, emit

#: Where Kueue's release manifests put the controller: ``config/default/kustomization.yaml`` (namespace
#: ``kueue-system``, name prefix ``kueue-``) over ``config/components/manager/manager.yaml`` (Deployment
#: ``controller-manager``), kubernetes-sigs/kueue at v0.17.1.
KUEUE_CONTROLLER = "kueue-system/kueue-controller-manager"
#: A release image's tag (``registry.k8s.io/kueue/kueue:v0.17.1``).
RELEASE_TAG = re.compile(r":v([0-9]+)\.([0-9]+)\.([0-9]+)$")


class KueueControllerError(pulumi.RunError):
    """The existing cluster runs no Kueue the stack's queues are written for; one line naming
    ``multislice:gke.cluster`` (a :class:`pulumi.RunError`: no traceback)."""


def check_kueue_controller(spec: Any, cluster: str) -> None:
    """Refuse an existing cluster whose Kueue (the Deployment :data:`KUEUE_CONTROLLER`'s ``spec``, as the
    Kubernetes provider reads it) runs a release below :data:`~infra.backends.gke.cluster.KUEUE_VERSION`,
    the one the stack's queues are written for (``kueue.x-k8s.io/v1beta2``); an image without a release
    tag (a build of one's own) is taken as it is, with a warning.

    Raises:
      KueueControllerError: naming ``multislice:gke.cluster`` and the version found.
    """
    containers = (((spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    images = [str(c.get("image") or "") for c in containers if isinstance(c, dict)]
    tags = [match for match in map(RELEASE_TAG.search, images) if match]
    if not tags:
        warning = act(
            f"multislice:gke.cluster: Kueue on {cluster} runs {', '.join(images) or 'no image'}, not a release, so "
            f"its version is not checked; the stack's queues are written for {KUEUE_VERSION} or later",
            "upgrade it there, or leave multislice:gke.cluster unset and the stack makes a cluster with it",
            when=f"that build predates {KUEUE_VERSION}",
        )
        emit(warning, pulumi.log.warn)
        return
    found = tuple(int(part) for part in tags[0].groups())
    if found < tuple(int(part) for part in KUEUE_VERSION.lstrip("v").split(".")):
        raise KueueControllerError(
            f"multislice:gke.cluster: cluster {cluster} runs Kueue v{'.'.join(map(str, found))} ({KUEUE_CONTROLLER}), "
            f"below {KUEUE_VERSION}, which the stack's queues (multislice:gke.queuedProvisioning) are written for: "
            "upgrade it there, or leave multislice:gke.cluster unset and the stack makes a cluster with it"
        )


def declare(
    inputs_queues: tuple[dict[str, Any], ...],
    *,
    installs: bool,
    cluster: str,
    in_cluster: pulumi.ResourceOptions,
    after: list[pulumi.Resource],
) -> tuple[list[pulumi.Resource], pulumi.Output[Any] | None]:
    """Kueue and the stack's queues in the cluster: Kueue's release manifests applied (``installs``: a cluster
    the stack makes; after ``after``, the JobSet controller, whose CRD Kueue's JobSet integration needs), or
    the existing cluster's Kueue read and checked (:func:`check_kueue_controller`), then each queue object.

    Returns the resources the JobSet waits for, and on an existing cluster the check's output (None on one
    the stack makes), which the JobSet's own declaration waits for too.
    """
    import pulumi_kubernetes as k8s

    checked: pulumi.Output[Any] | None = None
    if installs:
        controller: pulumi.Resource = k8s.yaml.v2.ConfigFile(
            "kueue-controller",
            file=manifests_url(),
            opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=list(after))),
        )
        before = [controller]
    else:  # a cluster the stack does not own: read its Kueue, never declare it
        deployment = k8s.apps.v1.Deployment.get("kueue-controller", KUEUE_CONTROLLER, opts=in_cluster)
        checked = deployment.spec.apply(lambda found: check_kueue_controller(found, cluster))
        before = []
    declared: list[pulumi.Resource] = []
    for queue in inputs_queues:
        metadata: Any = queue["metadata"]
        if checked is not None:  # declared once the cluster's Kueue passed (a refusal stops the update first)
            metadata = checked.apply(lambda _, m=queue["metadata"]: m)
        declared.append(
            k8s.apiextensions.CustomResource(
                f"kueue-{queue['kind'].lower()}",
                api_version=queue["apiVersion"],
                kind=queue["kind"],
                metadata=metadata,
                spec=queue["spec"],
                opts=pulumi.ResourceOptions.merge(
                    in_cluster, pulumi.ResourceOptions(depends_on=[*before, *after, *declared])
                ),
            )
        )
    return [*before, *declared], checked
