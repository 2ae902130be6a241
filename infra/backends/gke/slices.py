"""The gke backend's slices as Pulumi resources: :class:`GkeSlices`, from typed :class:`GkeInputs`.

A new zonal cluster (:func:`~infra.backends.gke.cluster.cluster_args`), or the existing one
``multislice:gke.cluster`` names; one TPU node pool per slice in the stack's zone
(:mod:`~infra.backends.gke.node_pools`), placed by one regional workload policy they all name on
TPU7x; and the Workload Identity binding through which the Pods'
Kubernetes service account acts as the stack's Google service account
(:mod:`~infra.backends.gke.cluster`). Everything a stack's inputs can get wrong is refused by
:func:`check` before the first resource is registered. The workload (the JobSet and what it needs)
is :class:`~infra.backends.gke.workload.GkeWorkload`, which reaches the cluster at the
``dns_endpoint`` this component answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi

from infra.backends.gke.cluster import (
    WORKLOAD_IDENTITY_ROLE,
    GkeSettings,
    check_cluster_location,
    cluster_args,
    workload_identity_member,
)
from infra.backends.gke.node_pools import NodePoolShape, node_config, placement_policy, workload_policy_args
from infra.naming import gce_name

if TYPE_CHECKING:
    from pulumi_gcp.container._inputs import NodePoolNodeConfigArgsDict


@dataclass(frozen=True)
class GkeInputs:
    """What the gke slices are made from (pure data; ``pulumi.Input`` values where a resource
    gives them).

    Attributes:
      stack, project, zone: the stack's name, ``gcp:project`` and ``gcp:zone``.
      cluster_name: the cluster a new one gets (ignored when ``settings.cluster`` names one).
      pool_names: one node pool name per slice, in slice order.
      shape: every slice's node pool (:func:`~infra.backends.gke.node_pools.slice_node_pool`).
      capacity, reservation_name, max_run_duration_seconds: ``multislice:capacity`` and its settings.
      settings: ``multislice:gke``.
      network, subnetwork: the stack's VPC and subnetwork (a new cluster's).
      service_account_email, service_account_id: the stack's Google service account (the nodes'
        and, through Workload Identity, the Pods'): its email and its resource id.
      kubernetes_service_account: the Pods' Kubernetes service account.
      labels: the stack's resource labels.
    """

    stack: str
    project: str
    zone: str
    cluster_name: str
    pool_names: tuple[str, ...]
    shape: NodePoolShape
    capacity: str
    settings: GkeSettings
    network: Any
    subnetwork: Any
    service_account_email: Any
    service_account_id: Any
    kubernetes_service_account: str
    reservation_name: str | None = None
    max_run_duration_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict[str, str])


def check(inputs: GkeInputs) -> None:
    """Refuse what GKE could not build from ``inputs``, before anything is declared.

    Raises:
      ValueError: an existing cluster outside the zone's region (``multislice:gke.clusterLocation``),
        a capacity the pools cannot request, or no slice; each message names its key.
    """
    if not inputs.pool_names:
        raise ValueError("multislice:slices: a gke stack needs at least one slice")
    if inputs.settings.cluster is not None:
        check_cluster_location(inputs.settings.cluster_location or inputs.zone, inputs.zone)
    _node_config(inputs)


def _node_config(inputs: GkeInputs) -> NodePoolNodeConfigArgsDict:
    return node_config(
        inputs.shape,
        inputs.capacity,
        service_account=inputs.service_account_email,
        reservation=inputs.reservation_name,
        max_run_duration_s=inputs.max_run_duration_seconds,
        labels=inputs.labels,
    )


class GkeSlices(pulumi.ComponentResource):
    """The cluster (new or existing), one node pool per slice, and the Pods' identity binding.

    Outputs: ``cluster_name`` and ``cluster_location`` (where the pools are), ``pool_names``, and
    ``dns_endpoint`` (the control plane's DNS-based endpoint, a host name, for
    :class:`~infra.backends.gke.workload.GkeWorkload`; "" where the cluster has none).

    Raises:
      ValueError: what :func:`check` refuses, before any resource is registered.
    """

    def __init__(self, name: str, inputs: GkeInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        check(inputs)
        super().__init__("multislice:gke:Slices", name, None, opts)
        from pulumi_gcp import container, serviceaccount

        child = pulumi.ResourceOptions(parent=self)
        settings = inputs.settings
        depends: list[pulumi.Resource] = []
        if settings.cluster is None:
            cluster = container.Cluster(
                "cluster",
                **cluster_args(
                    name=inputs.cluster_name,
                    project=inputs.project,
                    zone=inputs.zone,
                    network=inputs.network,
                    subnetwork=inputs.subnetwork,
                    labels=inputs.labels,
                    control_plane_cidr=settings.control_plane_cidr,
                ),
                opts=child,
            )
            depends.append(cluster)
            cluster_name: pulumi.Input[str] = cluster.name
            location = inputs.zone
            endpoint = cluster.control_plane_endpoints_config.apply(_dns_endpoint)
        else:
            cluster_name, location = settings.cluster, settings.cluster_location or inputs.zone
            found = container.get_cluster_output(name=cluster_name, location=location, project=inputs.project)
            endpoint = found.control_plane_endpoints_configs.apply(_looked_up_dns_endpoint)
        policy_name: pulumi.Input[str] | None = None
        if inputs.shape.workload_policy:  # TPU7x: one regional policy every slice's pool names
            from pulumi_gcp import compute

            policy = compute.ResourcePolicy(
                "workload-policy",
                name=gce_name("multislice", inputs.stack, "workload-policy"),
                project=inputs.project,
                region=inputs.zone.rsplit("-", 1)[0],
                description=f"Accelerator topology {inputs.shape.topology} of each slice of multislice stack "
                f"{inputs.stack}.",
                workload_policy=compute.ResourcePolicyWorkloadPolicyArgs(**workload_policy_args(inputs.shape)),
                opts=child,
            )
            policy_name = policy.name
        pools = [
            container.NodePool(
                pool,
                name=pool,
                project=inputs.project,
                cluster=cluster_name,
                location=location,
                node_locations=[inputs.zone],
                node_count=inputs.shape.node_count,
                placement_policy=placement_policy(inputs.shape, policy_name),
                node_config=_node_config(inputs),
                opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
            )
            for pool in inputs.pool_names
        ]
        serviceaccount.IAMMember(
            "workload-identity",
            service_account_id=inputs.service_account_id,
            role=WORKLOAD_IDENTITY_ROLE,
            member=workload_identity_member(inputs.project, settings.namespace, inputs.kubernetes_service_account),
            # The pool PROJECT.svc.id.goog exists once a cluster of the project has Workload Identity.
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
        )
        self.cluster_name = pulumi.Output.from_input(cluster_name)
        self.cluster_location = pulumi.Output.from_input(location)
        self.pool_names = pulumi.Output.all(*[pool.name for pool in pools])
        self.dns_endpoint: pulumi.Output[str] = endpoint
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "cluster_location": self.cluster_location,
                "pool_names": self.pool_names,
                "dns_endpoint": self.dns_endpoint,
            }
        )


def _dns_endpoint(config: Any) -> str:
    """A new cluster's DNS-based endpoint ("" until GKE answers one)."""
    dns = getattr(config, "dns_endpoint_config", None) if config is not None else None
    return (getattr(dns, "endpoint", None) or "") if dns is not None else ""


def _looked_up_dns_endpoint(configs: Any) -> str:
    """An existing cluster's DNS-based endpoint, from ``getCluster``'s lists ("" when it has none)."""
    for config in configs or []:
        for dns in getattr(config, "dns_endpoint_configs", None) or []:
            if getattr(dns, "endpoint", None):
                return dns.endpoint
    return ""
