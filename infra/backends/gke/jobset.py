"""The gke backend's workload: one JobSet whose child Jobs are the slices (:func:`jobset`).

Facts (docs/gke.md sections 4 and 5, each with its source there):

* **Shape** ([third-party] JobSet's TPU Multislice page and API, v0.12; [Google] GKE's two-slice
  samples; xpk agrees): ``jobset.x-k8s.io/v1alpha2`` JobSet, one replicated Job with ``replicas`` =
  slices, ``parallelism`` = ``completions`` = VMs per slice, ``backoffLimit: 0``; the annotation
  ``alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool`` gives each child
  Job a node pool of its own; the Pods select the TPU node labels and request every chip of their
  VM as ``google.com/tpu``.
* **Names**: Job ``<jobset>-<replicatedJob>-<jobIndex>``, Pod hostname
  ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` in the subdomain named after the JobSet; every
  Pod carries the label ``jobset.sigs.k8s.io/job-index`` (its slice).
* **Place within a slice** ([Google], quoted through a third party): GKE's webhook injects
  ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` into the Pods of an Indexed Job with a subdomain
  and a ``google.com/tpu`` request; the TPU device plugin injects ``TPU_SKIP_MDS_QUERY``,
  ``TPU_TOPOLOGY``, ``TPU_ACCELERATOR_TYPE``, the host and chip bounds and the runtime metrics
  ports ([Google] ai-on-gke/tpu-device-plugin). A workload's ``env`` may set none of them
  (:func:`refuse_injected`).
* **Across slices**: no page read names who sets ``MEGASCALE_*`` for a JobSet (docs/gke.md,
  question 1), so the Pod sets them itself, as users do in jobset#787 [third-party]: the slice
  count, the slice from the ``job-index`` label, and the coordinator at the host of process 0 (job
  0, Pod 0), where jax 0.10.2's ``cloud_tpu_cluster.py`` says JobSet puts it [Google].
* **Boot**: the container runs the stack's startup script, the release every VM boots, from a
  ConfigMap named after the release (:func:`startup_config_map_name`; a new release is a new name,
  so a new Pod template, so a new JobSet), as ``/bin/bash`` + the mounted file, the container's
  first process, which the kubelet signals; the run directory is the Pod's ``MULTISLICE_RUN_DIR``
  (GKE's metadata server serves no instance attributes of the stack's): infra/backends/gke/spec.py.
* **Repair**: a failed Pod fails its Job (``backoffLimit: 0``), and JobSet then recreates every
  Job, up to ``failurePolicy.maxRestarts`` times; a preempted node gives its Pods 30 s, of which an
  ordinary Pod gets the first 15 ([Google] "Spot VMs in GKE"), so ``terminationGracePeriodSeconds``
  above 15 buys nothing there.
* **Failures no restart mends** ([third-party] xpk's JobSet, ``src/xpk/commands/workload.py``: a
  ``podFailurePolicy`` rule ``FailJob`` on exit codes, and the JobSet rule ``FailJobSet`` on the job
  failure reason ``PodFailurePolicy``; Kubernetes' Job API and JobSet v0.10.1's CRD name both): the
  trainer's exit 78 (a configuration that cannot work) and the boot's 65 (a release it cannot verify)
  fail the Job at once, and the JobSet with it, the reason in its status; every other failure
  (preemption, a lost node, a crash) restarts the run as above.
* **The node's cache** (docs/gke.md section 6): a GKE TPU node runs Container-Optimized OS, which
  mounts ``/var`` writable but non-executable ([Google] "Disks and file system overview"), and a
  ``hostPath`` keeps the flag, so nothing may run from the node's folder. The boot's
  ``MULTISLICE_HOME`` (releases, virtualenvs, the uv-managed Python) is therefore a folder of the
  container's own filesystem (:data:`~infra.startup.boot.DEFAULT_HOME`, not a mount: it goes with the
  Pod), and the node's folder (:data:`NODE_CACHE_ROOT`, one per JobSet) is mounted at
  :data:`NODE_CACHE_MOUNT` as ``MULTISLICE_NODE_CACHE``, where the boot keeps only an archive of each
  virtualenv it built: a Pod started again on a node that already ran the release (JobSet recreates
  every Job, on the surviving nodes too) unpacks it instead of building the environment again; only a
  new node builds. xpk builds an image per workload instead; the archive needs no registry and keeps
  the release the stack rendered.
"""

from __future__ import annotations

from typing import Any

from infra.backends.gke.node_pools import TPU_RESOURCE, TPU_TOLERATION, NodePoolShape, node_selector
from infra.backends.gke.spec import injected_env_refusal
from infra.startup.boot import CONFIG_ERROR_STATUS
from infra.vm_contract import HOME_ENV, NODE_CACHE_ENV, RELEASE_UNVERIFIED_STATUS, RUN_DIR_ENV

API_VERSION = "jobset.x-k8s.io/v1alpha2"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
#: The replicated Job's name: each child Job is one slice.
REPLICATED_JOB = "slice"
#: The container's name in every Pod.
CONTAINER = "trainer"
#: Seconds a Pod has between SIGTERM and SIGKILL: what a preempted node grants an ordinary Pod
#: ("Spot VMs in GKE": the first 15 of the node's 30 s).
TERMINATION_GRACE_S = 15

#: What the Pod itself sets (module docstring): a workload may not set these either.
MEGASCALE_ENV = ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS")
#: Where the startup script's ConfigMap is mounted, and its key (the file's name there).
STARTUP_MOUNT = "/etc/multislice"
STARTUP_KEY = "startup.sh"
STARTUP_VOLUME = "startup"
#: Hex digits of the release id in the ConfigMap's name.
RELEASE_ID_CHARS = 12
#: The node folder under which each JobSet keeps its Pods' node cache (module docstring).
NODE_CACHE_ROOT = "/var/lib/multislice"
NODE_CACHE_VOLUME = "node-cache"
#: Where the container finds it (``MULTISLICE_NODE_CACHE``): not under its ``MULTISLICE_HOME``.
NODE_CACHE_MOUNT = "/mnt/multislice-node-cache"
#: The container's exit codes that end the run at once (module docstring).
FATAL_EXIT_CODES = (RELEASE_UNVERIFIED_STATUS, CONFIG_ERROR_STATUS)
#: JobSet's rule for them: a Job failed by its ``podFailurePolicy`` fails the JobSet.
FAIL_JOBSET_RULE = {"name": "noRetryMends", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}


def startup_config_map_name(name: str, release_id: str) -> str:
    """The ConfigMap holding release ``release_id``'s startup script for JobSet ``name``.

    Raises:
      ValueError: ``release_id`` is not a sha256 in hex.
    """
    if len(release_id) != 64 or any(c not in "0123456789abcdef" for c in release_id):
        raise ValueError(f"release id {release_id!r} is not a sha256 in hex")
    return f"{name}-startup-{release_id[:RELEASE_ID_CHARS]}"


def refuse_injected(env: dict[str, str]) -> None:
    """Refuse a workload ``env`` that sets what GKE or the Pod sets.

    Raises:
      ValueError: naming ``multislice:workload.env.<NAME>`` and who sets it.
    """
    for name in sorted(env):
        why = injected_env_refusal(name)
        if why is not None:
            raise ValueError(f"multislice:workload.env.{name}: {why}")
        if name in MEGASCALE_ENV or name in (RUN_DIR_ENV, NODE_CACHE_ENV, HOME_ENV):
            raise ValueError(
                f"multislice:workload.env.{name}: the JobSet's Pods set it themselves (docs/gke.md section 4): "
                "remove it"
            )


def coordinator_host(name: str) -> str:
    """The hostname of process 0's Pod (job 0, Pod 0) in the JobSet's subdomain."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def pod_env(name: str, slices: int, env: dict[str, str], run_dir: str) -> list[dict[str, Any]]:
    """The container's ``env``: the workload's ``env``, ``MULTISLICE_RUN_DIR``, ``MULTISLICE_NODE_CACHE``,
    then ``MEGASCALE_*`` for several slices.

    Raises:
      ValueError: ``env`` sets a name GKE or the Pod sets (:func:`refuse_injected`).
    """
    refuse_injected(env)
    entries: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    entries.append({"name": RUN_DIR_ENV, "value": run_dir})
    entries.append({"name": NODE_CACHE_ENV, "value": NODE_CACHE_MOUNT})
    if slices > 1:
        entries += [
            {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
            {
                "name": "MEGASCALE_SLICE_ID",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}},
            },
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator_host(name)},
        ]
    return entries


def jobset(
    *,
    name: str,
    namespace: str,
    shape: NodePoolShape,
    slices: int,
    image: str,
    startup_config_map: str,
    run_dir: str,
    env: dict[str, str],
    service_account: str,
    max_restarts: int,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The JobSet of a run on ``slices`` node pools of ``shape``: one Pod per VM.

    Args:
      name: the JobSet's name (a DNS label: it prefixes every Job and Pod hostname).
      namespace: its Kubernetes namespace.
      shape: each slice's node pool (:func:`~infra.backends.gke.node_pools.slice_node_pool`).
      slices: child Jobs (``multislice:slices``).
      image: the container's image (bash, curl, Python 3 with pip: what the boot runs).
      startup_config_map: the ConfigMap of the release's startup script
        (:func:`startup_config_map_name`), key :data:`STARTUP_KEY`.
      run_dir: the run directory (``gs://bucket/runs/<run>``).
      env: the workload's extra environment.
      service_account: the Kubernetes service account the Pods run as.
      max_restarts: how many times JobSet recreates every Job after a failure.
      labels: the Pods' labels besides those JobSet gives them (the stack's and the run's).

    Raises:
      ValueError: ``env`` sets a name GKE or the Pod sets; ``slices`` < 1 or ``max_restarts`` < 0.
    """
    if slices < 1 or max_restarts < 0:
        raise ValueError(f"slices must be ≥ 1 and max_restarts ≥ 0, not {slices} and {max_restarts}")
    container = {
        "name": CONTAINER,
        "image": image,
        "command": ["/bin/bash", f"{STARTUP_MOUNT}/{STARTUP_KEY}"],
        "env": pod_env(name, slices, env, run_dir),
        "volumeMounts": [
            {"name": STARTUP_VOLUME, "mountPath": STARTUP_MOUNT, "readOnly": True},
            {"name": NODE_CACHE_VOLUME, "mountPath": NODE_CACHE_MOUNT},  # archives only: never run there
        ],
        "resources": {
            "requests": {TPU_RESOURCE: str(shape.chips_per_node)},
            "limits": {TPU_RESOURCE: str(shape.chips_per_node)},
        },
    }
    pod_spec = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "nodeSelector": node_selector(shape),
        "tolerations": [dict(TPU_TOLERATION)],
        "containers": [container],
        "volumes": [
            {"name": STARTUP_VOLUME, "configMap": {"name": startup_config_map}},
            {
                "name": NODE_CACHE_VOLUME,
                "hostPath": {"path": f"{NODE_CACHE_ROOT}/{name}", "type": "DirectoryOrCreate"},
            },
        ],
    }
    if shape.host_network:  # as Google's TPU7x sample runs its Pods (node_pools.HOST_NETWORK_GENERATIONS)
        pod_spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    job_spec = {
        "parallelism": shape.node_count,
        "completions": shape.node_count,
        "backoffLimit": 0,
        "completionMode": "Indexed",
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": list(FATAL_EXIT_CODES)},
                }
            ]
        },
        "template": {"metadata": {"labels": dict(labels or {})}, "spec": pod_spec},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "annotations": {EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL}},
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts, "rules": [dict(FAIL_JOBSET_RULE)]},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": slices, "template": {"spec": job_spec}}],
        },
    }
