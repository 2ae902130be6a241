"""What GKE refuses in a TPU node pool or a cluster, as the program declares them (pulumi-gcp's
inputs as the engine sees them under mocks: camelCase), each rule with its source.

The Container API's discovery document judges field names, types and enums (tests/fakes/discovery.py);
these are the rules it does not carry, which GKE applies when it creates the pool. They are written
from Google's pages, Google's Cluster Toolkit (GoogleCloudPlatform/cluster-toolkit at 1047080:
``modules/compute/gke-node-pool/main.tf``) and what GKE answered third parties, independently of the
backend's own tables, so a pool the backend gets wrong fails here:

* **TPU slice size, per zone** (:func:`sizing_refusals`): a multi-host TPU slice pool holds the slice's
  VMs (its topology's chips over 4 chips a VM, gcloud 528's ``node-pools create --help``) or none:
  a static ``nodeCount`` is that number, and an autoscaled pool's *per-zone* bounds are 0 or that
  number. GKE checks the per-zone maximum, which total bounds leave at 0: "Maximum node count 0 is not
  a valid size of TPU pod slice with topology 2x2x2" (vllm-project/ci-infra pull request 545, GKE's
  answer to a pool with total bounds); Cluster Toolkit sets the per-zone bounds "to satisfy API
  requirements for fixed-size TPU slices" (its pull request 5111).
* **Flex-start** (:func:`flex_start_refusals`): Cluster Toolkit's preconditions, which repeat GKE's:
  "enable_flex_start needs node auto_repair set to false", "does not work with static_node_count",
  "requires reservation_affinity.consume_reservation_type to be 'NO_RESERVATION'", and not with Spot.
* **Queued provisioning** (:func:`queued_provisioning_refusals`, :func:`queued_pod_refusals`): Cluster
  Toolkit's preconditions ("reservation_affinity should be NO_RESERVATION when enable_queued_provisioning is
  true", "autoscaling_total_min_nodes should be 0", not with Spot); GKE taints such a pool's nodes
  ``cloud.google.com/gke-queued=true:NoSchedule`` itself (``enable_queued_provisioning``: "adds the
  cloud.google.com/gke-queued taint"), and Cluster Toolkit labels them so, "required for workloads using
  nodeSelectors": a Pod meant for them tolerates the taint and selects the label (its TPU test JobSets:
  "Mandatory for Queued Provisioning").
* **TPU7x** (:func:`tpu7x_refusals`): a multi-host TPU7x pool takes its placement from a workload
  policy it names (``placementPolicy.policyName``; Google's "Ironwood in GKE" page: create the
  workload policy, then the node pool with ``--placement-policy``).
* **Versions** (:func:`version_refusals`): TPU7x needs GKE 1.34.0-gke.2201000 or later ("Ironwood in
  GKE"), flex-start TPUs 1.33.0-gke.1712000 ("About provisioning models": "To run TPUs, use GKE version
  1.33.0-gke.1712000 or later"), Multislice 1.27.4-gke.900 ("Deploy TPU Multislices in GKE").
* **What a TPU node executes** (:func:`pod_exec_refusals`): GKE's TPU nodes run Container-Optimized OS,
  whose ``/home``, ``/var`` and ``/tmp`` are non-executable, but ``/var/lib/google``, ``/var/lib/docker``
  and ``/var/lib/toolbox`` (and ``/var/lib/cloud``, ``/etc``, ``/mnt/disks``) executable (COS "Disks and
  file system overview"); a ``hostPath`` volume is a bind mount, which keeps its source's flags (mount(8)),
  so a container cannot execute what lies under a mount of such a node path. The container executes
  its ``command[0]`` and, running the multislice boot, everything under the boot's ``MULTISLICE_HOME``
  (uv, its Python, the virtualenvs: docs/vm-boot.md; default ``/var/lib/multislice`` in the container).
"""

from __future__ import annotations

import math
import re
from typing import Any

#: Google's multi-host TPU machine types on GKE, each 4 chips a VM ("Plan TPUs in GKE"; TPU7x: "Ironwood
#: in GKE").
TPU_MACHINES = ("ct4p-hightpu-4t", "ct5lp-hightpu-4t", "ct5p-hightpu-4t", "ct6e-standard-4t", "tpu7x-standard-4t")
CHIPS_PER_VM = 4
TPU7X_MACHINE = "tpu7x-standard-4t"
MULTISLICE_FLOOR = "1.27.4-gke.900"
TPU7X_FLOOR = "1.34.0-gke.2201000"
FLEX_START_FLOOR = "1.33.0-gke.1712000"


def slice_vms(topology: str) -> int:
    """VMs of a slice of ``topology`` (``2x2x4`` → 16 chips → 4 VMs)."""
    return math.prod(int(side) for side in topology.split("x")) // CHIPS_PER_VM


def is_tpu_pool(inputs: dict[str, Any]) -> bool:
    return (inputs.get("nodeConfig") or {}).get("machineType") in TPU_MACHINES


def sizing_refusals(inputs: dict[str, Any]) -> list[str]:
    """A TPU slice pool not sized to its topology, per zone."""
    topology = (inputs.get("placementPolicy") or {}).get("tpuTopology")
    if not topology:
        return ["a multi-host TPU pool without placementPolicy.tpuTopology: GKE cannot size the slice"]
    vms, refusals = slice_vms(topology), []
    invalid = f"is not a valid size of TPU pod slice with topology {topology}"
    autoscaling = inputs.get("autoscaling")
    if inputs.get("nodeCount") is not None and inputs["nodeCount"] != vms:
        refusals.append(
            f"node count {inputs['nodeCount']} is not a valid size of TPU pod slice with topology {topology}"
        )
    if autoscaling is not None:
        per_zone_max = autoscaling.get("maxNodeCount", 0)  # total bounds leave the per-zone ones at 0
        if per_zone_max != vms:
            refusals.append(
                f"Maximum node count {per_zone_max} is not a valid size of TPU pod slice with topology {topology}"
            )
        if autoscaling.get("minNodeCount", 0) not in (0, vms):
            refusals.append(f"Minimum node count {autoscaling['minNodeCount']} {invalid}")
    if inputs.get("nodeCount") is None and autoscaling is None:
        refusals.append(f"a TPU slice pool with neither a node count nor autoscaling (topology {topology})")
    return refusals


def flex_start_refusals(inputs: dict[str, Any]) -> list[str]:
    config = inputs.get("nodeConfig") or {}
    if not config.get("flexStart"):
        return []
    refusals = []
    if (inputs.get("management") or {}).get("autoRepair", True):
        refusals.append("enable_flex_start needs node auto_repair set to false")
    if inputs.get("nodeCount") is not None:
        refusals.append("enable_flex_start does not work with static_node_count")
    if (config.get("reservationAffinity") or {}).get("consumeReservationType") != "NO_RESERVATION":
        refusals.append(
            "enable_flex_start requires reservation_affinity.consume_reservation_type to be 'NO_RESERVATION'"
        )
    if config.get("spot"):
        refusals.append("Both enable_flex_start and spot consumption option cannot be set to true at the same time")
    return refusals


QUEUED = "cloud.google.com/gke-queued"


def is_queued(inputs: dict[str, Any]) -> bool:
    return bool((inputs.get("queuedProvisioning") or {}).get("enabled"))


def queued_provisioning_refusals(inputs: dict[str, Any]) -> list[str]:
    if not is_queued(inputs):
        return []
    config, refusals = inputs.get("nodeConfig") or {}, []
    if (config.get("reservationAffinity") or {}).get("consumeReservationType") != "NO_RESERVATION":
        refusals.append("reservation_affinity should be NO_RESERVATION when enable_queued_provisioning is true")
    if config.get("spot"):
        refusals.append("Both enable_queued_provisioning and spot consumption option cannot be set to true")
    autoscaling = inputs.get("autoscaling") or {}
    if inputs.get("nodeCount") is not None or autoscaling.get("minNodeCount", autoscaling.get("totalMinNodeCount", 0)):
        refusals.append("autoscaling_total_min_nodes should be 0 when enable_queued_provisioning is true")
    if (config.get("labels") or {}).get(QUEUED) != "true":
        refusals.append(f"a queued-provisioning pool's nodes carry no {QUEUED}=true label for the Pods to select")
    return refusals


def queued_pod_refusals(pod_spec: dict[str, Any], pools: list[dict[str, Any]]) -> list[str]:
    """A Pod that cannot land on the stack's queued-provisioning pools (none: no pool is queued)."""
    if not any(is_queued(pool) for pool in pools):
        return []
    refusals = []
    tolerated = {"key": QUEUED, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    if tolerated not in (pod_spec.get("tolerations") or []):
        refusals.append(f"the Pod does not tolerate {QUEUED}=true:NoSchedule, the taint of a queued pool's nodes")
    if (pod_spec.get("nodeSelector") or {}).get(QUEUED) != "true":
        refusals.append(f"the Pod does not select {QUEUED}: true")
    return refusals


def tpu7x_refusals(inputs: dict[str, Any]) -> list[str]:
    if (inputs.get("nodeConfig") or {}).get("machineType") != TPU7X_MACHINE:
        return []
    if not (inputs.get("placementPolicy") or {}).get("policyName"):
        return ["a multi-host TPU7x pool needs the workload policy it is placed by (placementPolicy.policyName)"]
    return []


def _version(text: str) -> tuple[int, ...]:
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?", text)
    if match is None:
        raise ValueError(f"{text!r} is not a GKE version")
    return tuple(int(part or 0) for part in match.groups())


def version_refusals(cluster: dict[str, Any], pools: list[dict[str, Any]]) -> list[str]:
    """A cluster whose minimum version (``minMasterVersion``, when pinned) is below what its pools need."""
    pinned = cluster.get("minMasterVersion")
    if not pinned:
        return []  # the release channel's default version, above every floor today
    floors = [MULTISLICE_FLOOR]
    floors += [TPU7X_FLOOR for pool in pools if (pool.get("nodeConfig") or {}).get("machineType") == TPU7X_MACHINE]
    floors += [FLEX_START_FLOOR for pool in pools if (pool.get("nodeConfig") or {}).get("flexStart")]
    return [f"GKE {pinned} is below {floor}" for floor in floors if _version(pinned) < _version(floor)]


def node_pool_refusals(inputs: dict[str, Any]) -> list[str]:
    """Every rule above that a node pool breaks ([] for a pool that is not a TPU slice pool)."""
    if not is_tpu_pool(inputs):
        return []
    return (
        sizing_refusals(inputs)
        + flex_start_refusals(inputs)
        + queued_provisioning_refusals(inputs)
        + tpu7x_refusals(inputs)
    )


#: Node pool inputs whose change replaces the pool: ``ForceNew`` in the provider pulumi-gcp bridges
#: (hashicorp/terraform-provider-google-beta ``google-beta/services/container/resource_container_node_pool.go``
#: at 003e704: ``placement_policy``, ``queued_provisioning``, ``max_pods_per_node``, with ``project``,
#: ``cluster`` and ``location``).
FORCE_NEW = ("placementPolicy", "queuedProvisioning", "maxPodsPerNode", "project", "cluster", "location")


def _set_path(values: dict[str, Any], path: str, value: Any) -> None:
    *parents, key = path.split(".")
    for parent in parents:
        values = values.setdefault(parent, {})
    values[key] = value


def _get_path(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(values, dict) or part not in values:
            return None
        values = values[part]
    return values


def replaced_on_update(stored: dict[str, Any], declared: dict[str, Any], ignore_changes: list[str]) -> list[str]:
    """The inputs of :data:`FORCE_NEW` whose change would replace a pool whose state GKE ``stored``
    when the program declares ``declared``: the engine first puts the stored value back at each
    ``ignoreChanges`` path (Pulumi's "ignoreChanges" resource option), then the provider diffs."""
    declared = {key: (dict(value) if isinstance(value, dict) else value) for key, value in declared.items()}
    for path in ignore_changes:
        _set_path(declared, path, _get_path(stored, path))
    return [key for key in FORCE_NEW if stored.get(key) != declared.get(key)]


#: Node paths Container-Optimized OS mounts non-executable, and the executable ones below them (COS
#: "Disks and file system overview").
COS_NOEXEC = ("/home", "/var", "/tmp")
COS_EXEC_BELOW_NOEXEC = ("/var/lib/google", "/var/lib/docker", "/var/lib/toolbox", "/var/lib/cloud")
#: The multislice boot's default MULTISLICE_HOME (docs/vm-boot.md), where it executes uv and Python.
BOOT_HOME = "/var/lib/multislice"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def cos_noexec(node_path: str) -> bool:
    """Whether Container-Optimized OS mounts ``node_path`` non-executable."""
    if any(_under(node_path, root) for root in COS_EXEC_BELOW_NOEXEC):
        return False
    return any(_under(node_path, root) for root in COS_NOEXEC)


def pod_exec_refusals(pod_spec: dict[str, Any]) -> list[str]:
    """Each container path the Pod would execute from a mount of a non-executable node path."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    refusals = []
    for container in pod_spec.get("containers") or []:
        noexec = []
        for mount in container.get("volumeMounts") or []:
            host = (volumes.get(mount["name"]) or {}).get("hostPath")
            if host and cos_noexec(host["path"]):
                noexec.append((mount["mountPath"], host["path"]))
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        executed = [(container["command"][0], "its command")] if container.get("command") else []
        executed.append(
            (env.get("MULTISLICE_HOME") or BOOT_HOME, "the boot's MULTISLICE_HOME (uv, Python, virtualenvs)")
        )
        for path, what in executed:
            for mount_path, host_path in noexec:
                if _under(path, mount_path):
                    refusals.append(
                        f"container {container['name']} executes {what} at {path}, on hostPath {host_path}, "
                        "which Container-Optimized OS mounts non-executable"
                    )
    return refusals
