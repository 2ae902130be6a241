"""The gke backend's slices as Pulumi resources: :class:`GkeSlices`, from typed :class:`GkeInputs`.

A new zonal (or, with ``multislice:gke.regional``, regional) cluster
(:func:`~infra.backends.gke.cluster_declaration.cluster_args`) with its system pool
(:func:`~infra.backends.gke.node_pools.system_pool`), or the existing one ``multislice:gke.cluster``
names, checked once GKE answers for it (:func:`check_existing_cluster`); one TPU node pool per slice in the stack's zone
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

from infra.backends.gke import kueue, versions
from infra.backends.gke.cluster import (
    WORKLOAD_IDENTITY_ROLE,
    GkeSettings,
    check_cluster_location,
    region_of,
    workload_identity_member,
    workload_pool,
)
from infra.backends.gke.cluster_declaration import cluster_args
from infra.backends.gke.node_pools import (
    GKE_TPUS,
    NodePoolShape,
    node_config,
    placement_policy,
    pool_size,
    system_pool,
    upgrade_settings,
    workload_policy_args,
)
from infra.naming import gce_name

#: The system pool's name in a new cluster.
SYSTEM_POOL = "system"
#: What a TPU7x pool's update leaves as GKE stored it: the placement policy's ``type``. The provider
#: pulumi-gcp bridges replaces a pool on any change of ``placement_policy`` (``ForceNew`` on the block,
#: hashicorp/terraform-provider-google-beta ``google-beta/services/container/resource_container_node_pool.go``
#: at 003e704) and reads ``type`` back as the Container API stores it, and a third party saw GKE store a
#: policy-named TPU7x pool with no type ([third-party] vllm-project/ci-infra pull request 547): without this,
#: every ``pulumi up`` after the first would replace every TPU7x pool, a slice each.
IGNORED_AFTER_CREATE = ["placementPolicy.type"]

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
      generation: the TPU generation's name (its GKE version floor).
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
    generation: str = ""


def check(inputs: GkeInputs) -> None:
    """Refuse what GKE could not build from ``inputs``, before anything is declared.

    Raises:
      ValueError: an existing cluster outside the zone's region (``multislice:gke.clusterLocation``),
        a capacity the pools cannot request (queued provisioning without flex-start among them), or no
        slice; each message names its key.
    """
    if not inputs.pool_names:
        raise ValueError("multislice:slices: a gke stack needs at least one slice")
    if inputs.settings.cluster is not None:
        check_cluster_location(inputs.settings.cluster_location or inputs.zone, inputs.zone)
    versions.check_version(inputs.settings.version, inputs.generation, inputs.capacity)
    if (why := kueue.capacity_refusal(inputs.settings.queued_provisioning, inputs.capacity)) is not None:
        raise ValueError(f"multislice:gke.queuedProvisioning: {why}")
    _node_config(inputs)


class ExistingClusterError(pulumi.RunError):
    """The cluster ``multislice:gke.cluster`` names cannot take the stack's pools or Pods; one line
    naming the key (a :class:`pulumi.RunError`: no traceback)."""


def check_existing_cluster(found: Any, inputs: GkeInputs) -> None:
    """Refuse an existing cluster (``getCluster``'s answer) without what the stack needs: Workload
    Identity with the project's pool (the Pods act as the stack's service account through it), a pool
    that is not TPU for the JobSet controller and the cluster's services (TPU pools are tainted), and a
    GKE version at or above the generation's and capacity's floor (:mod:`~infra.backends.gke.versions`).

    Raises:
      ExistingClusterError: naming ``multislice:gke.cluster`` and what to change.
    """
    name, project = inputs.settings.cluster, inputs.project
    pools = [getattr(c, "workload_pool", None) for c in getattr(found, "workload_identity_configs", None) or []]
    if workload_pool(project) not in pools:
        raise ExistingClusterError(
            f"multislice:gke.cluster: cluster {name} has no Workload Identity pool {workload_pool(project)}, "
            "through which the run's Pods act as the stack's service account: enable it (gcloud container clusters "
            f"update {name} --workload-pool={workload_pool(project)}) or leave multislice:gke.cluster unset"
        )
    tpu_machines = {machine for machine, _ in GKE_TPUS.values()}
    machines = [
        getattr(config, "machine_type", "")
        for pool in getattr(found, "node_pools", None) or []
        for config in getattr(pool, "node_configs", None) or []
    ]
    if machines and all(machine in tpu_machines for machine in machines):
        raise ExistingClusterError(
            f"multislice:gke.cluster: cluster {name} has only TPU node pools; the JobSet controller and the cluster's "
            "services need a CPU pool (TPU nodes are tainted google.com/tpu=present:NoSchedule): add one, or leave "
            "multislice:gke.cluster unset and the stack makes a cluster with its system pool"
        )
    version = (getattr(found, "master_version", None) or "").split("+")[0]
    needed = versions.floor(inputs.generation, inputs.capacity)
    if needed and versions.VERSION.fullmatch(version) and versions.parse(version) < versions.parse(needed[0]):
        raise ExistingClusterError(
            f"multislice:gke.cluster: cluster {name} runs GKE {version}, below {needed[0]}, which the stack's node "
            f"pools need ({needed[1]}): upgrade its control plane, or leave multislice:gke.cluster unset"
        )


def _node_config(inputs: GkeInputs) -> NodePoolNodeConfigArgsDict:
    return node_config(
        inputs.shape,
        inputs.capacity,
        service_account=inputs.service_account_email,
        reservation=inputs.reservation_name,
        max_run_duration_s=inputs.max_run_duration_seconds,
        labels=inputs.labels,
        node_labels=kueue.node_labels(inputs.settings.queued_provisioning),
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
                    version=settings.version,
                    deletion_protection=settings.deletion_protection,
                    pod_range=settings.pod_range,
                    service_range=settings.service_range,
                    regional=settings.regional,
                ),
                opts=child,
            )
            depends.append(cluster)
            cluster_name: pulumi.Input[str] = cluster.name
            location = region_of(inputs.zone) if settings.regional else inputs.zone
            endpoint = cluster.control_plane_endpoints_config.apply(_dns_endpoint)
            system = settings.system_pool
            depends.append(
                container.NodePool(
                    SYSTEM_POOL,
                    name=SYSTEM_POOL,
                    project=inputs.project,
                    cluster=cluster.name,
                    location=location,
                    node_locations=[inputs.zone],
                    **system_pool(
                        machine_type=system.machine_type,
                        min_nodes=system.min_nodes,
                        max_nodes=system.max_nodes,
                        service_account=inputs.service_account_email,
                        labels=inputs.labels,
                    ),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster]),
                )
            )
        else:
            location = settings.cluster_location or inputs.zone
            found = container.get_cluster_output(name=settings.cluster, location=location, project=inputs.project)
            # The pools wait for the cluster's check: a cluster that cannot take them stops the update first.
            existing = settings.cluster
            cluster_name = found.apply(lambda answer: check_existing_cluster(answer, inputs) or existing or "")
            endpoint = found.control_plane_endpoints_configs.apply(_looked_up_dns_endpoint)
        policy_name: pulumi.Input[str] | None = None
        if inputs.shape.workload_policy:  # TPU7x: one regional policy every slice's pool names
            from pulumi_gcp import compute

            policy = compute.ResourcePolicy(
                "workload-policy",
                name=gce_name("multislice", inputs.stack, "workload-policy"),
                project=inputs.project,
                region=region_of(inputs.zone),
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
                **pool_size(inputs.shape, inputs.capacity),
                **kueue.pool_args(settings.queued_provisioning),
                upgrade_settings=upgrade_settings(),
                placement_policy=placement_policy(inputs.shape, policy_name),
                node_config=_node_config(inputs),
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=depends, ignore_changes=IGNORED_AFTER_CREATE if policy_name else None
                ),
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
