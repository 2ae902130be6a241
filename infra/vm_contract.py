"""The contract between ``pulumi up`` and a TPU VM: every name both sides spell.

``pulumi up`` (the program, ``infra/__main__.py``, and the queued-resource provider,
:mod:`infra.queued_resource`) writes node metadata and bucket objects; the VM's scripts
(``startup.sh.in``, ``boot.sh.in``, ``trainer.sh``, ``delete_on_complete.sh`` beside this
module) and the trainer (``training/``) read them, and the local emulation (:mod:`infra.local`)
plays Cloud TPU's part. Each name is declared once, here, and everything in ``infra/`` imports
it from here; the shell templates spell the names too (tests/startup/test_contract.py checks
that each name a template uses is declared here, and the converse), and ``training/`` (which
never imports ``infra/``) spells the ones it reads (the same test ties them).

This module imports nothing (it sits below every package that uses it).
"""

from __future__ import annotations

# Node metadata: ``instance/attributes/<key>`` on every VM of the queued resource ---------------

#: Set by ``pulumi up``: the startup script (GCE runs it at every boot).
STARTUP_SCRIPT_KEY = "startup-script"
#: Set by ``pulumi up``: the run directory, ``gs://<bucket>/runs/<run name>`` (or a local path).
RUN_DIR_KEY = "multislice-run-dir"
#: Set by ``pulumi up`` with ``multislice:queuedResource.deleteOnComplete`` only: the queued
#: resource's name, which worker 0 of slice 0 deletes once the run is complete
#: (``delete_on_complete.sh``).
DELETE_QUEUED_RESOURCE_KEY = "multislice-delete-queued-resource"
#: Set by Cloud TPU on every VM of a queued resource (read by ``boot.sh``, the trainer and JAX:
#: ``training.cluster``).
WORKER_NUMBER_KEY = "agent-worker-number"
WORKER_ENDPOINTS_KEY = "worker-network-endpoints"
TPU_ENV_KEY = "tpu-env"
ACCELERATOR_TYPE_KEY = "accelerator-type"
#: Set by ``pulumi up`` on the compute-engine backend only: Compute Engine documents none of
#: Cloud TPU's identity keys for its TPU VMs, so the program gives every VM what it needs to
#: find its place itself (docs/compute-engine.md, "4. How a VM learns its place in the job").
#: ``compute-engine`` on such a VM (absent on a queued resource's VMs); that backend's identity
#: phase checks it (a release knows its backend: it was rendered for it).
BACKEND_KEY = "multislice-backend"
#: The slices' managed instance groups, comma-separated in slice order (the instance template).
INSTANCE_GROUPS_KEY = "multislice-instance-groups"
#: This VM's slice index (the group's ``all_instances_config`` metadata).
SLICE_ID_KEY = "multislice-slice-id"
#: VMs per slice (the instance template): a VM waits until its group lists that many.
WORKERS_PER_SLICE_KEY = "multislice-workers-per-slice"
#: The accelerator type (the instance template); Cloud TPU's ``accelerator-type`` is not set there.
COMPUTE_ENGINE_ACCELERATOR_KEY = "multislice-accelerator-type"
#: The trainer's TPU environment that does not depend on the VMs' addresses (the instance template;
#: ``infra.backends.compute_engine.tpu_env``): ``NAME=value`` pairs separated by spaces.
COMPUTE_ENGINE_TPU_ENV_KEY = "multislice-tpu-env"
#: The backend value of :data:`BACKEND_KEY`.
COMPUTE_ENGINE_BACKEND = "compute-engine"
#: The identity ``boot.sh`` exports to the trainer's unit on the compute-engine backend, as
#: GKE gives it to a TPU Pod (JAX's ``GkeTpuCluster`` reads the first two from the environment,
#: ``BaseTpuCluster`` reads the ``MEGASCALE_*`` values from the environment first:
#: ``jax/_src/clusters/cloud_tpu_cluster.py``).
COMPUTE_ENGINE_IDENTITY_ENV = (
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
)
#: The run directory in a gke Pod's environment (the JobSet sets it; its metadata server serves no
#: :data:`RUN_DIR_KEY`): read by the gke backend's identity phase.
RUN_DIR_ENV = "MULTISLICE_RUN_DIR"
#: The metadata keys ``pulumi up`` sets (:func:`node_metadata`).
PULUMI_KEYS = (STARTUP_SCRIPT_KEY, RUN_DIR_KEY, DELETE_QUEUED_RESOURCE_KEY)
#: The metadata keys Cloud TPU sets.
CLOUD_TPU_KEYS = (WORKER_NUMBER_KEY, WORKER_ENDPOINTS_KEY, TPU_ENV_KEY, ACCELERATOR_TYPE_KEY)


def delete_on_complete_metadata(queued_resource_name: str, *, delete_on_complete: bool) -> dict[str, str]:
    """``{DELETE_QUEUED_RESOURCE_KEY: queued_resource_name}`` with ``deleteOnComplete``, else ``{}``: what
    every node's metadata says about the release (``pulumi up`` and the local emulation alike).

    Args:
      queued_resource_name: ``projects/<p>/locations/<zone>/queuedResources/<id>``.
      delete_on_complete: the stack's ``deleteOnComplete``.
    """
    return {DELETE_QUEUED_RESOURCE_KEY: queued_resource_name} if delete_on_complete else {}


def node_metadata(
    *, startup_script: str, run_dir: str, queued_resource_name: str, delete_on_complete: bool
) -> dict[str, str]:
    """Every node's metadata as ``pulumi up`` sets it: the startup script, the run directory and,
    with ``deleteOnComplete``, the name of the queued resource to delete once the run is complete."""
    return {
        STARTUP_SCRIPT_KEY: startup_script,
        RUN_DIR_KEY: run_dir,
        **delete_on_complete_metadata(queued_resource_name, delete_on_complete=delete_on_complete),
    }


# The release record: bucket objects ``pulumi up`` writes and ``boot.sh`` reads ---------------

#: Where in the bucket ``pulumi up`` writes what the VMs boot (``multislice/<stack>/``: the
#: record, the release payloads and the workload sources). Only ``pulumi up`` writes it: the
#: VMs' service account reads it and cannot write it (``infra.components.service_account``;
#: the policy ``vm-cannot-write-release``).
RELEASE_PREFIX = "multislice/"
#: Version of the record's JSON shape.
RECORD_FORMAT = 1
#: The record's fields that ``boot.sh`` reads (the others describe it: ``format``, ``stack``).
RECORD_FIELDS_READ = ("release", "payload", "runDir")


def record_object(stack: str) -> str:
    """Bucket object of the stack's release record (JSON, :func:`release_record`)."""
    return f"{RELEASE_PREFIX}{stack}/release.json"


def release_object(stack: str, release_id: str) -> str:
    """Bucket object holding release ``release_id`` (its tar, base64)."""
    return f"{RELEASE_PREFIX}{stack}/releases/{release_id}.tar.b64"


def release_record(*, stack: str, release_id: str, run_dir: str) -> dict[str, object]:
    """The record's fields: the release every VM of ``stack`` runs, where its payload is, and
    the run directory (``boot.sh`` reads :data:`RECORD_FIELDS_READ`)."""
    return {
        "format": RECORD_FORMAT,
        "payload": release_object(stack, release_id),
        "release": release_id,
        "runDir": run_dir,
        "stack": stack,
    }


def workload_source_object(stack: str, source_sha256: str) -> str:
    """Bucket object holding a ``multislice:workload.source`` too large for the startup script
    (its tar; ``boot.sh`` fetches it and checks ``source_sha256``)."""
    return f"{RELEASE_PREFIX}{stack}/sources/{source_sha256}.tar"


# Environment variables ----------------------------------------------------------------------
# All optional: a real TPU VM sets none of the overrides, and the defaults are Google's.

#: Metadata server ``host[:port]`` (as JAX, google-auth and the VM's scripts read it).
METADATA_HOST_ENV = "GCE_METADATA_IP"
#: Cloud Storage endpoint (``host:port`` or a URL; as gcsfs reads it).
STORAGE_ENDPOINT_ENV = "STORAGE_EMULATOR_HOST"
#: Cloud TPU API endpoint (the provider, ``status`` and ``delete_on_complete.sh``).
TPU_API_ENDPOINT_ENV = "MULTISLICE_TPU_API_ENDPOINT"
#: Compute API endpoint (``boot.sh`` on the compute-engine backend: the slices' managed instance
#: groups and their VMs; a loopback fake in tests and in the local emulation).
COMPUTE_API_ENDPOINT_ENV = "MULTISLICE_COMPUTE_API_ENDPOINT"
#: Seconds ``boot.sh`` waits on the compute-engine backend for the groups to list every VM
#: (default ``infra.backends.compute_engine.spec.GROUP_WAIT_S``).
GROUP_WAIT_ENV = "MULTISLICE_GROUP_WAIT_S"
#: Cloud Logging endpoint (the trainer's log shipper and ``multislice logs``).
LOGGING_ENDPOINT_ENV = "MULTISLICE_LOGGING_ENDPOINT"
#: The VM's state directory (releases, virtualenvs, boot lock); in a Pod, a folder of its
#: container's own filesystem (executable, gone with the Pod).
HOME_ENV = "MULTISLICE_HOME"
#: A Pod's node cache: a folder its node keeps across Pods (a ``hostPath``), which the boot only
#: stores archives of its virtualenvs in and unpacks them from, never runs anything from (a GKE node
#: mounts it non-executable: infra/emulated/node_mounts.py; docs/gke.md section 6).
NODE_CACHE_ENV = "MULTISLICE_NODE_CACHE"
#: The file in it a boot holds an exclusive ``flock`` on from start to end (startup.sh.in, and
#: release_watch.sh around the boot of a new release).
BOOT_LOCK_FILE = ".boot.lock"
#: A Python that already has the trainer's dependencies: no virtualenv is built.
PYTHON_ENV = "MULTISLICE_PYTHON"
#: Where ``boot.sh`` writes the trainer's unit file.
SYSTEMD_DIR_ENV = "MULTISLICE_SYSTEMD_DIR"
#: First delay of every boot retry (and of ``delete_on_complete.sh``'s retries), seconds.
RETRY_DELAY_ENV = "MULTISLICE_RETRY_DELAY_S"
#: The trainer's restart backoff and its cap, seconds (``trainer.sh``).
RESTART_BACKOFF_ENV = "MULTISLICE_RESTART_BACKOFF_S"
RESTART_BACKOFF_MAX_ENV = "MULTISLICE_RESTART_BACKOFF_MAX_S"
#: Seconds ``delete_on_complete.sh`` keeps retrying the delete.
DELETE_DEADLINE_ENV = "MULTISLICE_DELETE_DEADLINE_S"
#: Seconds between two reads of the release record by the release watch (``release_watch.sh``;
#: default ``infra.startup.boot.RELEASE_POLL_S``).
RELEASE_POLL_ENV = "MULTISLICE_RELEASE_POLL_S"
#: Seconds a multi-host Spot slice must have been seen lost before the compute-engine slice watch
#: recreates its VMs (``slice_watch.sh``; default
#: ``infra.backends.compute_engine.spec.SLICE_WATCH_GRACE_S``).
SLICE_WATCH_GRACE_ENV = "MULTISLICE_SLICE_WATCH_GRACE_S"
#: Set by ``boot.sh`` in the trainer's unit on the compute-engine backend: the release record
#: (``gs://<bucket>/<record object>``) that ``trainer.sh`` reads before it starts the trainer.
RELEASE_RECORD_ENV = "MULTISLICE_RELEASE_RECORD"
#: Set by ``boot.sh`` in the trainer's unit: this VM's slice and worker (every line's prefix).
SLICE_ENV = "MULTISLICE_SLICE"
WORKER_ENV = "MULTISLICE_WORKER"
#: Set by ``boot.sh`` in the trainer's unit, from the stack's backend (``BackendSpec`` of
#: :mod:`infra.backends`): where the trainer finds this VM's identity (``metadata``: Cloud TPU's
#: keys; ``environment``: ``TPU_WORKER_ID`` and the rest, :data:`COMPUTE_ENGINE_IDENTITY_ENV`) and
#: the Cloud Logging monitored resource its lines go to (``tpu_worker``, ``gce_instance``).
IDENTITY_ENV = "MULTISLICE_IDENTITY"
LOG_RESOURCE_ENV = "MULTISLICE_LOG_RESOURCE"
#: Set by ``boot.sh`` in the trainer's unit: the stack's compilation cache, shared by every run
#: (``gs://<bucket>/``:data:`COMPILATION_CACHE_FOLDER`; ``training.compile_cache``), unless the
#: VM's environment already names one (the test suite's, through the local emulation).
COMPILATION_CACHE_ENV = "MULTISLICE_COMPILATION_CACHE_DIR"
#: Set by ``boot.sh`` in the trainer's and the standby's units (``multislice:warmStandby``): the
#: warm standby's folder (``training.standby_handoff``); unset, every attempt starts cold.
STANDBY_DIR_ENV = "MULTISLICE_STANDBY_DIR"
#: The folder of the stack's bucket that holds the compilation cache, beside ``runs/``.
COMPILATION_CACHE_FOLDER = "compilation-cache"
#: Trainer settings the local emulation sets (``training.cluster`` reads them; a TPU VM uses
#: the defaults): the JAX coordinator's port and the ``jax.distributed`` timeouts.
COORDINATOR_PORT_ENV = "MULTISLICE_COORDINATOR_PORT"
HEARTBEAT_TIMEOUT_ENV = "MULTISLICE_HEARTBEAT_TIMEOUT_S"
INIT_TIMEOUT_ENV = "MULTISLICE_INIT_TIMEOUT_S"
#: Seconds between two heartbeats of an elastic run's trainer (``training.heartbeats``; 10 on a VM).
ELASTIC_HEARTBEAT_ENV = "MULTISLICE_ELASTIC_HEARTBEAT_S"

#: What the VM's scripts read or pass on (each appears in a template).
SCRIPT_ENV = (
    METADATA_HOST_ENV,
    STORAGE_ENDPOINT_ENV,
    TPU_API_ENDPOINT_ENV,
    COMPUTE_API_ENDPOINT_ENV,
    GROUP_WAIT_ENV,
    HOME_ENV,
    NODE_CACHE_ENV,
    PYTHON_ENV,
    SYSTEMD_DIR_ENV,
    RETRY_DELAY_ENV,
    RESTART_BACKOFF_ENV,
    RESTART_BACKOFF_MAX_ENV,
    DELETE_DEADLINE_ENV,
    RELEASE_POLL_ENV,
    SLICE_WATCH_GRACE_ENV,
    RELEASE_RECORD_ENV,
    SLICE_ENV,
    WORKER_ENV,
    IDENTITY_ENV,
    LOG_RESOURCE_ENV,
    COMPILATION_CACHE_ENV,
    STANDBY_DIR_ENV,
    RUN_DIR_ENV,
)
#: Passed between the release's own scripts (the bootstrap → ``boot.sh``, ``trainer.sh`` →
#: ``delete_on_complete.sh``, ``release_watch.sh`` → ``boot.sh``); nothing outside the release sets them.
SCRIPT_INTERNAL_ENV = (
    "MULTISLICE_RELEASE_ID",
    "MULTISLICE_RELEASE_FETCHED",
    "MULTISLICE_RELEASE_UNPACKED",
    "MULTISLICE_RELEASE_WATCHING",
    "MULTISLICE_LINE_PREFIX",
    "MULTISLICE_FOREGROUND",
    # trainer.sh → delete_on_complete.sh: the slice that wrote the completion marker (python -m training
    # completed-by), whose worker 0 deletes the queued resource
    "MULTISLICE_COMPLETION_SLICE",
    # trainer.sh → the trainer: when the attempt started, after the restart backoff
    # (training.metrics.goodput.process_start_time)
    "MULTISLICE_ATTEMPT_STARTED",
)
#: What the trainer (``training/``) reads (each appears in its source).
TRAINER_ENV = (
    METADATA_HOST_ENV,
    LOGGING_ENDPOINT_ENV,
    SLICE_ENV,
    WORKER_ENV,
    IDENTITY_ENV,
    LOG_RESOURCE_ENV,
    COORDINATOR_PORT_ENV,
    HEARTBEAT_TIMEOUT_ENV,
    INIT_TIMEOUT_ENV,
    ELASTIC_HEARTBEAT_ENV,
    COMPILATION_CACHE_ENV,
    STANDBY_DIR_ENV,
)

#: What a stack's own command finds in its environment (``multislice:workload``; set by
#: ``training.workload``; docs/workloads.md is the documented contract), besides
#: ``MULTISLICE_SLICE`` and ``MULTISLICE_WORKER`` and the ``MEGASCALE_*`` values of ``tpu-env``.
WORKLOAD_ENV = (
    "MULTISLICE_RUN_DIR",
    "MULTISLICE_CHECKPOINT_DIR",
    "MULTISLICE_METRICS_DIR",
    "MULTISLICE_EVENTS_DIR",
    "MULTISLICE_STEPS",
    "MULTISLICE_NUM_SLICES",
    "MULTISLICE_WORKERS_PER_SLICE",
    "MULTISLICE_PROCESS_ID",
    "MULTISLICE_NUM_PROCESSES",
    "MULTISLICE_COORDINATOR_ADDRESS",
    "MULTISLICE_ACCELERATOR_TYPE",
)
#: The ``tpu-env`` values a multislice queued resource sets, passed to a command as they are.
MEGASCALE_ENV = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT")

# Endpoints and names on the VM ----------------------------------------------------------------

DEFAULT_METADATA_HOST = "metadata.google.internal"
DEFAULT_STORAGE_ENDPOINT = "https://storage.googleapis.com"
DEFAULT_TPU_API_ENDPOINT = "https://tpu.googleapis.com"
#: The Compute API's endpoint (``BASE_URL`` of gcloud's compute v1 client is
#: ``https://compute.googleapis.com/compute/v1/``: googlecloudsdk/generated_clients/apis/compute/v1).
DEFAULT_COMPUTE_API_ENDPOINT = "https://compute.googleapis.com"
#: The systemd unit that runs the trainer (written by ``boot.sh``; docs/vm-boot.md).
TRAINER_UNIT = "multislice-trainer.service"
#: The unit of the warm standby trainer (written by ``boot.sh`` beside the trainer's with
#: ``multislice:warmStandby``; training/standby.py, docs/vm-boot.md "The warm standby").
STANDBY_UNIT = "multislice-standby.service"
#: The unit that reads the release record on a compute-engine VM (written by ``boot.sh``,
#: run by ``release_watch.sh``; docs/vm-boot.md, "The release watch").
RELEASE_WATCH_UNIT = "multislice-release-watch.service"
#: Exit status of ``trainer.sh`` when the release record names another release than the unit's
#: (compute-engine backend): an older trainer never starts beside updated slices, and systemd
#: does not restart it (``RestartPreventExitStatus=``); the release watch boots the recorded one.
RELEASE_SUPERSEDED_STATUS = 76
#: Exit status of the startup script and ``boot.sh`` when the release cannot be verified: the
#: embedded release does not decode or its sha256 is not the release id, or the recorded release's
#: or the command's source's payload is corrupt (EX_DATAERR of sysexits.h, "The input data was
#: incorrect in some way"). No retry mends that; on GKE it fails the JobSet at once
#: (infra/backends/gke/jobset.py, ``podFailurePolicy``), where other failures restart it.
RELEASE_UNVERIFIED_STATUS = 65
#: The Cloud Logging log the VMs write (``training.log_shipping.LOG_NAME``) and
#: ``multislice logs`` reads.
TRAINER_LOG = "multislice-trainer"
#: The marker the trainer writes in the run directory once the run is complete
#: (``training.checkpoint.completion.COMPLETE_MARKER``); the provider reads it (deleteOnComplete).
COMPLETE_MARKER = "COMPLETE"
