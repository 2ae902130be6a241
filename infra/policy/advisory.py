"""The advisory policies of the pack (:data:`infra.policy.policies.POLICIES` lists them with their levels;
``stacks/policy.prod.json`` makes them mandatory on prod)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from infra.policy.resource_types import (
    BUCKET_TYPE,
    GKE_CLUSTER_TYPE,
    GKE_NODE_POOL_TYPE,
    INSTANCE_GROUP_TYPE,
    INSTANCE_TEMPLATE_TYPE,
    QUEUED_RESOURCE_TYPE,
    REQUIRED_LABELS,
    TPU_VM_TYPE,
    Report,
)


def _labels(args: ResourceValidationArgs) -> Mapping[str, Any] | None:
    """A labelled resource's labels (a GKE cluster's ``resourceLabels``, a node pool's nodes'
    ``nodeConfig.resourceLabels``); None for a type the label rules do not cover."""
    if args.resource_type == GKE_CLUSTER_TYPE:
        return args.props.get("resourceLabels") or {}
    if args.resource_type == GKE_NODE_POOL_TYPE:
        return (args.props.get("nodeConfig") or {}).get("resourceLabels") or {}
    if "labels" not in args.props or args.resource_type not in (
        QUEUED_RESOURCE_TYPE,
        BUCKET_TYPE,
        TPU_VM_TYPE,
        INSTANCE_TEMPLATE_TYPE,
    ):
        return None
    return args.props.get("labels") or {}


def required_labels(args: ResourceValidationArgs, report: Report) -> None:
    labels = _labels(args)
    if labels is None:
        return
    missing = [key for key in REQUIRED_LABELS if not labels.get(key)]
    if missing:
        report(f"{args.name!r} lacks the label(s) {', '.join(missing)} (cost attribution)")


def _is_prod(labels: Mapping[str, Any]) -> bool:
    stack = str(labels.get("multislice-stack") or "")
    return labels.get("env") == "prod" or stack == "prod" or stack.startswith("prod-")


def prod_capacity(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == GKE_NODE_POOL_TYPE:
        node = args.props.get("nodeConfig") or {}
        if _is_prod(node.get("resourceLabels") or {}) and node.get("spot") and not args.opts.protect:
            report(
                f"prod node pool {args.name!r} makes Spot VMs and is not protected: they can be preempted at any "
                "time; use reserved, on-demand or flex-start capacity or protect it"
            )
        return
    if not _is_prod(args.props.get("labels") or {}):
        return
    if args.resource_type == INSTANCE_TEMPLATE_TYPE:
        # Spot VMs are preempted at any time; flex-start, on-demand and reserved VMs are not.
        scheduling = args.props.get("scheduling") or {}
        if (scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")) and not args.opts.protect:
            report(
                f"prod instance template {args.name!r} makes Spot VMs and is not protected: they can be "
                "preempted at any time; use reserved, on-demand or flex-start capacity or protect it"
            )
        return
    if args.resource_type != QUEUED_RESOURCE_TYPE:
        return
    capacity = args.props.get("capacity")
    if capacity not in ("reserved", "on-demand") and not args.opts.protect:
        report(
            f"prod queued resource {args.name!r} is on {capacity} capacity and not protected: "
            "it can be preempted at any time; use reserved capacity or protect it"
        )


def gke_deletion_protection(args: ResourceValidationArgs, report: Report) -> None:
    """A prod GKE cluster is protected from deletion (``deletionProtection``; a destroy of a protected
    one fails until the stack sets it false and ``pulumi up`` runs: docs/deploying.md)."""
    if args.resource_type != GKE_CLUSTER_TYPE or not _is_prod(args.props.get("resourceLabels") or {}):
        return
    if not args.props.get("deletionProtection"):
        report(
            f"prod GKE cluster {args.name!r} has no deletion protection: set multislice:gke.deletionProtection: true "
            "(pulumi destroy then fails until it is set false again and applied)"
        )


def backend_change(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != INSTANCE_GROUP_TYPE:
        return
    from infra.backends.compute_engine.inputs import REPLACES_QUEUED_RESOURCE

    if args.props.get("description") == REPLACES_QUEUED_RESOURCE:
        report(
            f"managed instance group {args.name!r} replaces the stack's queued resource "
            "(multislice:backend changed, confirmed by multislice:allowBackendChange): every TPU VM is deleted and "
            "its capacity requested again"
        )
