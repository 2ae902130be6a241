"""One GKE TPU node pool per slice: :func:`slice_node_pool` (its shape) and :func:`node_config`
(its ``node_config`` per capacity mode), pure functions the gke backend's program turns into
``gcp.container.NodePool`` args.

Facts (docs/gke.md sections 2 and 3, each with its source there):

* A multi-host TPU slice is one node pool of VMs that GKE creates, repairs and scales as a unit,
  and Multislice on GKE takes only multi-host slice node pools ([Google] "Deploy TPU Multislices in
  GKE"; the page names ``ct4p-hightpu-4t`` at 2x2x1 and ``ct5lp-hightpu-4t`` at 2x2 as single-host
  pools that cannot be used). TPU v3 is excluded; the catalog lists none.
* Machine type and the ``cloud.google.com/gke-tpu-accelerator`` label per generation: the table of
  docs/gke.md section 2 ([Google] GKE's pages and samples, the ai-on-gke TPU device plugin;
  [third-party] xpk's ``system_characteristics.py``). Every multi-host VM has 4 chips.
* Placement: ``COMPACT`` with the slice's topology (``placementPolicy.tpuTopology``) for v4, v5e,
  v5p and v6e; TPU7x takes its placement from a ``HIGH_THROUGHPUT`` workload policy (a Compute
  Engine resource policy carrying the accelerator topology) instead ([Google] "Ironwood in GKE"). The
  pool sends what Google's Cluster Toolkit sends for it: ``type: COMPACT``, the policy's name and the
  topology (``modules/compute/resource-policy``'s ``placement_policy`` output, used by its TPU7x
  blueprints; the Container API's ``PlacementPolicy.policyName`` "refers to the name of a custom
  resource policy"). Third parties differ: xpk sends the policy alone, and one saw an empty type come
  up RUNNING (vllm-project/ci-infra pull request 547); docs/gke.md section 2 says which source decided.
* Node count = the slice's VMs ([Google] gcloud 528's ``node-pools create --help``: the topology's
  chips divided by the machine type's), fixed, except on flex-start (below).
* Capacity ([Google] gcloud 528's flags, pulumi-gcp 10.2's ``NodePoolNodeConfig``, and Cluster
  Toolkit's ``gke-node-pool`` preconditions): ``spot`` → ``spot`` with reservation affinity
  ``NO_RESERVATION`` ("Spot consumption option only works with reservation_affinity
  consume_reservation_type NO_RESERVATION"); ``reserved`` → ``reservation_affinity`` (SPECIFIC_RESERVATION
  by name, else ANY_RESERVATION); ``flex-start`` → ``flex_start`` with ``NO_RESERVATION``, no static node
  count but autoscaling from 0 to the slice's VMs in its zone (per-zone bounds: :func:`pool_size`) with
  ``location_policy: ANY``, and auto-repair off
  ("enable_flex_start needs node auto_repair set to false"; "does not work with static_node_count";
  "requires ... NO_RESERVATION"; [third-party] xpk's ``--flex-start --enable-autoscaling
  --location-policy=ANY --reservation-affinity=none --no-enable-autorepair --num-nodes=0``); its nodes
  run at most ``max_run_duration``, seven days by default (GKE's flex-start page); ``on-demand`` → none
  of them. Every pool runs the GKE metadata server (``workload_metadata_config.mode`` GKE_METADATA), which
  Workload Identity needs ([Google] gcloud's ``--workload-metadata``).
* Taint: every TPU pool carries ``google.com/tpu=present:NoSchedule`` ([Google] Cluster Toolkit's
  ``modules/internal/tpu-definition``), so only Pods that tolerate it (the run's) land on TPU nodes;
  the cluster's own Pods go to the system pool (:func:`system_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.accelerators import AcceleratorType

if TYPE_CHECKING:  # the type checker holds the dicts below to pulumi-gcp's own input types
    from pulumi_gcp.container._inputs import (
        NodePoolNodeConfigArgsDict,
        NodePoolPlacementPolicyArgsDict,
        NodePoolUpgradeSettingsArgsDict,
    )

#: Per generation: the multi-host machine type (4 chips a VM) and the node label value GKE gives
#: its nodes (``cloud.google.com/gke-tpu-accelerator``); docs/gke.md section 2's table.
GKE_TPUS: dict[str, tuple[str, str]] = {
    "v4": ("ct4p-hightpu-4t", "tpu-v4-podslice"),
    "v5e": ("ct5lp-hightpu-4t", "tpu-v5-lite-podslice"),
    "v5p": ("ct5p-hightpu-4t", "tpu-v5p-slice"),
    "v6e": ("ct6e-standard-4t", "tpu-v6e-slice"),
    "tpu7x": ("tpu7x-standard-4t", "tpu7x"),
}
#: The generations whose multi-host pools are placed by a workload policy, not COMPACT + topology.
WORKLOAD_POLICY_GENERATIONS = frozenset({"tpu7x"})
#: The generations whose Pods run on the node's network (``hostNetwork: true`` with ``dnsPolicy:
#: ClusterFirstWithHostNet``), as [Google] kubernetes-engine-samples ``ai-ml/gke-tpu-dynamic-slicing/
#: tpu-multislice-jax.yaml`` (2b50365) runs its TPU7x JobSet; xpk does the same. Google's v6e multislice
#: sample sets neither, so the others keep the Pod network.
HOST_NETWORK_GENERATIONS = frozenset({"tpu7x"})
#: The boot disk type per machine type where Google's blueprints set one: every [Google] Cluster Toolkit
#: v6e and TPU7x blueprint (``examples/gke-tpu-v6e``, ``gke-tpu-7x``, ``gke-consumption-options/dws-flex-start*``
#: at 1047080) sets ``disk_type: hyperdisk-balanced``; for the others GKE picks its default.
BOOT_DISK_TYPES = {"ct6e-standard-4t": "hyperdisk-balanced", "tpu7x-standard-4t": "hyperdisk-balanced"}


#: That policy's type, the one that takes an accelerator topology (gcloud's ``resource-policies
#: create workload-policy --type=HIGH_THROUGHPUT --accelerator-topology``, the Ironwood page's command;
#: pulumi-gcp ``ResourcePolicyWorkloadPolicyArgs``).
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
#: The node labels a TPU Pod selects (docs/gke.md section 2).
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
#: The extended resource a TPU container requests, in chips (docs/gke.md section 5).
TPU_RESOURCE = "google.com/tpu"
#: The key pulumi-gcp takes a reservation's name under (``SPECIFIC_RESERVATION``).
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"
#: The capacity modes a node pool can request (``multislice:capacity``).
CAPACITIES = ("spot", "on-demand", "reserved", "flex-start")
#: The taint of every TPU pool (module docstring), as pulumi-gcp's ``node_config.taints`` takes it, and
#: the toleration a TPU Pod carries (Kubernetes' spelling of the same effect).
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NO_SCHEDULE"}
TPU_TOLERATION = {"key": TPU_RESOURCE, "operator": "Equal", "value": "present", "effect": "NoSchedule"}


class NodePoolError(ValueError):
    """A slice GKE cannot give as a Multislice node pool; the message names the stack key."""


@dataclass(frozen=True)
class NodePoolShape:
    """What one slice's node pool is.

    Attributes:
      machine_type: the VMs' machine type (``ct5p-hightpu-4t``).
      accelerator: the value of :data:`ACCELERATOR_LABEL` on its nodes (``tpu-v5p-slice``).
      topology: the slice's chip topology, the value of :data:`TOPOLOGY_LABEL` (``2x2x2``).
      node_count: VMs in the slice (one Pod each).
      chips_per_node: chips per VM: the Pod's :data:`TPU_RESOURCE` request.
      workload_policy: placed by a workload policy (TPU7x) rather than COMPACT + topology.
      host_network: its Pods run on the node's network (:data:`HOST_NETWORK_GENERATIONS`).
    """

    machine_type: str
    accelerator: str
    topology: str
    node_count: int
    chips_per_node: int
    workload_policy: bool
    host_network: bool = False


def slice_node_pool(accelerator: AcceleratorType) -> NodePoolShape:
    """The node pool of one slice of ``accelerator``.

    Raises:
      NodePoolError: GKE has no node pool for the generation, or the slice is one VM (Multislice
        on GKE takes multi-host slice node pools only); the message names
        ``multislice:acceleratorType`` and the smallest multi-host type of the generation.
    """
    gen = accelerator.generation
    if gen.name not in GKE_TPUS:
        raise NodePoolError(
            f"multislice:acceleratorType: {accelerator.name}: GKE offers no TPU node pool for {gen.name} "
            f"(it offers {', '.join(GKE_TPUS)}; docs/gke.md section 2)"
        )
    if accelerator.hosts < 2:
        smallest = next(
            (gen.type_name(s) for s in gen.sizes if gen.chips_per_host(gen.chips_for_size(s)) < gen.chips_for_size(s)),
            None,
        )
        hint = f"; the smallest multi-host {gen.name} slice is {smallest}" if smallest else ""
        raise NodePoolError(
            f"multislice:acceleratorType: {accelerator.name} is one VM per slice, and Multislice on GKE takes "
            f"multi-host slice node pools only (Google's 'Deploy TPU Multislices in GKE'){hint}"
        )
    machine_type, label = GKE_TPUS[gen.name]
    if int(machine_type.rsplit("-", 1)[1].rstrip("t")) != accelerator.chips_per_host:
        raise NodePoolError(  # the catalog and this table disagree: a bug here, not the stack's
            f"{accelerator.name}: {accelerator.chips_per_host} chips per VM, but {machine_type} has another count"
        )
    return NodePoolShape(
        machine_type=machine_type,
        accelerator=label,
        topology=accelerator.topology,
        node_count=accelerator.hosts,
        chips_per_node=accelerator.chips_per_host,
        workload_policy=gen.name in WORKLOAD_POLICY_GENERATIONS,
        host_network=gen.name in HOST_NETWORK_GENERATIONS,
    )


def placement_policy(shape: NodePoolShape, workload_policy: Any = None) -> NodePoolPlacementPolicyArgsDict:
    """The pool's ``placement_policy`` (pulumi-gcp ``NodePoolPlacementPolicyArgsDict``): ``COMPACT``
    with the slice's topology, and for a workload-policy generation (TPU7x) the policy's name
    ``workload_policy`` (a pulumi Input) too, as Cluster Toolkit sends it (module docstring).

    Raises:
      ValueError: a workload-policy generation without ``workload_policy`` (a bug in the caller).
    """
    if not shape.workload_policy:
        return {"type": "COMPACT", "tpu_topology": shape.topology}
    if workload_policy is None:
        raise ValueError(f"a {shape.machine_type} node pool needs its workload policy's name")
    return {"type": "COMPACT", "policy_name": workload_policy, "tpu_topology": shape.topology}


def workload_policy_args(shape: NodePoolShape) -> dict[str, str]:
    """The ``workload_policy`` of the Compute Engine resource policy a TPU7x pool names
    (pulumi-gcp ``ResourcePolicyWorkloadPolicyArgs``): :data:`WORKLOAD_POLICY_TYPE` with the
    slice's topology."""
    return {"type": WORKLOAD_POLICY_TYPE, "accelerator_topology": shape.topology}


def node_config(
    shape: NodePoolShape,
    capacity: str,
    *,
    service_account: Any,
    reservation: str | None = None,
    max_run_duration_s: int | None = None,
    labels: dict[str, str] | None = None,
    node_labels: dict[str, str] | None = None,
) -> NodePoolNodeConfigArgsDict:
    """The pool's ``node_config`` (pulumi-gcp ``NodePoolNodeConfigArgsDict``) for ``capacity``.

    Args:
      shape: the slice's pool (:func:`slice_node_pool`).
      capacity: one of :data:`CAPACITIES` (``multislice:capacity``).
      service_account: the nodes' Google service account (a pulumi Input of its email).
      reservation: the reservation to consume (``reserved``; None: any matching reservation).
      max_run_duration_s: seconds each node may run (None: GKE's default, seven days for flex-start).
      labels: the stack's labels, on the nodes' VMs.
      node_labels: Kubernetes labels of the nodes (a queued-provisioning pool's: :mod:`~infra.backends.gke.kueue`).

    Raises:
      NodePoolError: an unknown capacity.
    """
    config: NodePoolNodeConfigArgsDict = {
        "machine_type": shape.machine_type,
        "service_account": service_account,
        "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        "resource_labels": dict(labels or {}),
        "taints": [{"key": TPU_TAINT["key"], "value": TPU_TAINT["value"], "effect": TPU_TAINT["effect"]}],
        # gVNIC on, as Cluster Toolkit's gke-node-pool sets it on every Container-Optimized OS pool.
        "gvnic": {"enabled": True},
    }
    if shape.machine_type in BOOT_DISK_TYPES:
        config["disk_type"] = BOOT_DISK_TYPES[shape.machine_type]
    if node_labels:
        config["labels"] = dict(node_labels)
    if capacity == "spot":
        config["spot"] = True
        config["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}
    elif capacity == "reserved":
        config["reservation_affinity"] = (
            {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": RESERVATION_NAME_KEY, "values": [reservation]}
            if reservation
            else {"consume_reservation_type": "ANY_RESERVATION"}
        )
    elif capacity == "flex-start":  # its nodes run at most maxRunDuration, seven days by default
        config["flex_start"] = True
        config["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}
    elif capacity != "on-demand":
        raise NodePoolError(f"multislice:capacity: {capacity!r} is not one of {', '.join(CAPACITIES)}")
    if max_run_duration_s is not None:
        config["max_run_duration"] = f"{max_run_duration_s}s"
    return config


def pool_size(shape: NodePoolShape, capacity: str) -> dict[str, Any]:
    """How many VMs the pool holds and who repairs them (pulumi-gcp ``NodePool`` args): the slice's VMs
    as a fixed ``node_count``; on flex-start none, but ``autoscaling`` from 0 to the slice's VMs with
    ``location_policy: ANY`` and ``management.auto_repair`` off (module docstring).

    The flex-start bounds are the per-zone ones (``min_node_count``, ``max_node_count``; the pool has one
    zone), never the total ones: GKE checks a TPU slice pool's per-zone maximum against its topology,
    and with only total bounds that maximum is 0, which it refuses ("Maximum node count 0 is not a valid
    size of TPU pod slice with topology 2x2x2", [third-party] vllm-project/ci-infra pull request 545).
    [Google] Cluster Toolkit sets the per-zone bounds "to satisfy API requirements for fixed-size TPU
    slices" (its pull request 5111; ``modules/compute/gke-node-pool/main.tf`` at 1047080, whose
    ``dws-flex-start`` v6e and TPU7x blueprints set ``autoscaling_min_node_count: 0`` and
    ``autoscaling_max_node_count`` to the slice's VMs with one zone); xpk passes ``--max-nodes``.
    """
    if capacity != "flex-start":
        return {"node_count": shape.node_count}
    return {
        "autoscaling": {"min_node_count": 0, "max_node_count": shape.node_count, "location_policy": "ANY"},
        "management": {"auto_repair": False, "auto_upgrade": True},
    }


def system_pool(
    *, machine_type: str, min_nodes: int, max_nodes: int, service_account: Any, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The args of a new cluster's system pool (pulumi-gcp ``NodePool``, beside ``cluster`` and
    ``location``): on-demand CPU nodes, autoscaled between ``min_nodes`` and ``max_nodes``, repaired and
    upgraded by GKE, no taint (the JobSet controller tolerates none), the GKE metadata server and the
    stack's service account, as Cluster Toolkit's ``gke-cluster`` makes its system pool."""
    return {
        "autoscaling": {"total_min_node_count": min_nodes, "total_max_node_count": max_nodes},
        "management": {"auto_repair": True, "auto_upgrade": True},
        "node_config": {
            "machine_type": machine_type,
            "service_account": service_account,
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "resource_labels": dict(labels or {}),
        },
    }


def node_selector(shape: NodePoolShape) -> dict[str, str]:
    """The node labels a Pod of the slice selects (docs/gke.md section 5)."""
    return {ACCELERATOR_LABEL: shape.accelerator, TOPOLOGY_LABEL: shape.topology}


def upgrade_settings() -> NodePoolUpgradeSettingsArgsDict:
    """A TPU pool's ``upgrade_settings`` (pulumi-gcp ``NodePoolUpgradeSettingsArgsDict``): ``SURGE`` with no
    surge node and one node unavailable at a time, [Google] Cluster Toolkit ``gke-node-pool``'s defaults
    (``max_surge`` 0, ``max_unavailable`` 1, strategy ``SURGE``, 1047080); GKE's own default surge of one
    node asks for capacity beyond the slice."""
    return {"strategy": "SURGE", "max_surge": 0, "max_unavailable": 1}
