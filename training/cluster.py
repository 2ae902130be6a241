"""Who am I in the job: process identity from TPU VM metadata, and ``jax.distributed``.

A Cloud TPU VM learns its place from the GCE metadata server (mirrors
``jax/_src/clusters/cloud_tpu_cluster.py``; see docs/cloud-tpu.md):

* ``instance/attributes/agent-worker-number``: this VM's worker index inside its slice;
* ``instance/attributes/worker-network-endpoints``: comma list of the slice's workers, each
  ``name:id:ip`` (the IP is the third field) or a bare host name;
* ``instance/attributes/tpu-env``: lines ``KEY: 'value'``; a multislice queued resource sets
  ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID``.

``process_id = slice_id × workers_per_slice + worker`` and the coordinator (process 0) is
the MEGASCALE coordinator host, or the slice's first worker for a single slice, on port
8482 (JAX ≥ 0.8.1). The metadata host is ``$GCE_METADATA_IP`` (host[:port]) when set: the
local emulator points each emulated VM at its own loopback metadata server.

A Compute Engine TPU VM (``multislice:backend: compute-engine``) has none of those keys:
``boot.sh`` finds its place from the Compute API and writes it into the trainer unit's
environment as GKE gives it to a TPU Pod (docs/compute-engine.md, "4. How a VM learns its place"):

* ``TPU_WORKER_ID``: this VM's worker index inside its slice;
* ``TPU_PROCESS_ADDRESSES`` and ``TPU_WORKER_HOSTNAMES``: comma lists of the slice's workers'
  addresses (``host:port``), in worker order (JAX reads the first where both are set);
* ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID`` (more
  than one slice only).

:func:`identity_from_environment` reads them as JAX's ``GkeTpuCluster`` and
``BaseTpuCluster`` do (``get_tpu_env_value``: the environment first). Which of the two a VM's
trainer reads is what its boot wrote into the unit from the stack's backend:
``MULTISLICE_IDENTITY`` = ``metadata`` or ``environment`` (:func:`identity_in_environment`); a
trainer started without it (by hand) reads the environment whenever ``TPU_WORKER_HOSTNAMES`` (or
``TPU_PROCESS_ADDRESSES``) is set, as JAX checks ``GkeTpuCluster`` before ``GceTpuCluster``. The
accelerator type is then the metadata key ``multislice-accelerator-type`` (``pulumi up`` sets it
in the instance template).

Identity is read afresh at every start and never cached: after auto-repair the MEGASCALE
values can change, and stale ones point at VMs that are gone (docs/cloud-tpu.md).

Environment knobs (the emulator sets them; real VMs use the defaults), passed to
``jax.distributed.initialize`` (https://docs.jax.dev/en/latest/_autosummary/jax.distributed.initialize.html):
``MULTISLICE_COORDINATOR_PORT`` (8482), ``MULTISLICE_INIT_TIMEOUT_S`` →
``initialization_timeout`` (900 s, JAX's is 300: the slices of a cold multislice start boot
minutes apart), ``MULTISLICE_HEARTBEAT_TIMEOUT_S`` → ``heartbeat_timeout_seconds`` (100 s:
a dead peer ends every process within it). Bounds: docs/jax-on-cpu.md, "Failures"; each value is
checked by :mod:`training.knobs` (a bad one is one line naming the variable).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Literal, overload

from training import knobs

log = logging.getLogger(__name__)

#: JAX's coordinator port on Cloud TPU since JAX 0.8.1 (cloud_tpu_cluster.coordinator_port).
DEFAULT_COORDINATOR_PORT = 8482
DEFAULT_INIT_TIMEOUT_S = 900
DEFAULT_HEARTBEAT_TIMEOUT_S = 100
METADATA_PATH = "/computeMetadata/v1/instance/attributes/"


class MetadataError(RuntimeError):
    """The metadata server did not answer, or answered something unusable."""


def metadata_host() -> str:
    return os.environ.get("GCE_METADATA_IP", "metadata.google.internal")


@overload
def get_metadata(key: str, *, required: Literal[True] = True, attempts: int = 6, timeout_s: float = 10.0) -> str: ...
@overload
def get_metadata(key: str, *, required: bool, attempts: int = 6, timeout_s: float = 10.0) -> str | None: ...
def get_metadata(key: str, *, required: bool = True, attempts: int = 6, timeout_s: float = 10.0) -> str | None:
    """Read ``instance/attributes/<key>`` from the metadata server.

    Retries connection errors and 5xx with a short backoff (bounded: ``attempts`` tries,
    ``timeout_s`` each). A 404 means the key is not set.

    Returns:
      The value as text, or None when the key is absent and ``required`` is False.

    Raises:
      MetadataError: absent required key, or the server unreachable after all attempts.
    """
    url = f"http://{metadata_host()}{METADATA_PATH}{key}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    last_error: Exception | None = None
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                if required:
                    raise MetadataError(f"metadata key {key!r} is not set ({url})") from None
                return None
            last_error = err
        except (urllib.error.URLError, OSError) as err:
            last_error = err
        time.sleep(min(0.5 * 2**attempt, 5.0))
    raise MetadataError(f"metadata server unreachable for {key!r} at {url}: {last_error}")


def parse_tpu_env(text: str) -> dict[str, str]:
    """Parse ``tpu-env`` lines ``KEY: 'value'`` into a dict (quotes stripped)."""
    env = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            env[key.strip()] = value.strip().strip("'")
    return env


def parse_worker_endpoints(text: str) -> list[str]:
    """Hosts of the slice's workers from ``worker-network-endpoints``, in worker order.

    Raises:
      MetadataError: an entry is neither ``host`` nor ``name:id:ip``.
    """
    hosts = []
    for entry in text.strip().split(","):
        parts = entry.split(":")
        if len(parts) == 1 and parts[0]:
            hosts.append(parts[0])
        elif len(parts) == 3:
            hosts.append(parts[2])
        else:
            raise MetadataError(f"unsupported worker-network-endpoints entry {entry!r}")
    return hosts


@dataclasses.dataclass(frozen=True)
class ClusterIdentity:
    """This process's place in the job.

    Attributes:
      worker: index of this VM inside its slice (0-based).
      workers_per_slice: TPU VMs per slice.
      slice_id: index of this slice (0-based).
      num_slices: slices in the job.
      coordinator_address: ``host:port`` of process 0's coordination service.
      accelerator_type: e.g. ``v4-8``; None outside a TPU VM.
      host: this worker's own host (its slice's entry ``worker``, without a port); empty when unknown.
    """

    worker: int
    workers_per_slice: int
    slice_id: int
    num_slices: int
    coordinator_address: str
    accelerator_type: str | None = None
    host: str = ""

    @property
    def process_id(self) -> int:
        return self.slice_id * self.workers_per_slice + self.worker

    @property
    def num_processes(self) -> int:
        return self.num_slices * self.workers_per_slice

    @property
    def label(self) -> str:
        return f"slice {self.slice_id} worker {self.worker}"

    @classmethod
    def single_process(cls) -> ClusterIdentity:
        """One process that is the whole job (no jax.distributed)."""
        return cls(worker=0, workers_per_slice=1, slice_id=0, num_slices=1, coordinator_address="")


def coordinator_port(environ: Mapping[str, str] | None = None) -> int:
    """``MULTISLICE_COORDINATOR_PORT`` of ``environ`` (default: this process's environment), else
    :data:`DEFAULT_COORDINATOR_PORT`.

    Raises:
      MetadataError: not a port (:mod:`training.knobs`; the message names the variable).
    """
    try:
        return knobs.integer("MULTISLICE_COORDINATOR_PORT", DEFAULT_COORDINATOR_PORT, environ)
    except knobs.KnobError as err:
        raise MetadataError(str(err)) from None


def identity_from_metadata() -> ClusterIdentity:
    """Read this VM's identity from the metadata server (see module docstring).

    Raises:
      MetadataError: a required key is missing or malformed.
    """
    worker_text = get_metadata("agent-worker-number")
    hosts = parse_worker_endpoints(get_metadata("worker-network-endpoints"))
    tpu_env = parse_tpu_env(get_metadata("tpu-env", required=False) or "")
    accelerator_type = get_metadata("accelerator-type", required=False)
    try:
        worker = int(worker_text.strip())
        num_slices = int(tpu_env.get("MEGASCALE_NUM_SLICES") or 1)
        slice_id = int(tpu_env.get("MEGASCALE_SLICE_ID") or 0)
    except ValueError as err:
        raise MetadataError(f"malformed TPU metadata: {err}") from None
    if not 0 <= worker < len(hosts):
        raise MetadataError(f"agent-worker-number {worker} is outside the slice's {len(hosts)} workers")
    if not 0 <= slice_id < num_slices:
        raise MetadataError(f"MEGASCALE_SLICE_ID {slice_id} is outside MEGASCALE_NUM_SLICES {num_slices}")
    coordinator_host = tpu_env.get("MEGASCALE_COORDINATOR_ADDRESS") or hosts[0]
    coordinator_host = coordinator_host.split(":")[0]
    port = coordinator_port()
    return ClusterIdentity(
        worker=worker,
        workers_per_slice=len(hosts),
        slice_id=slice_id,
        num_slices=num_slices,
        coordinator_address=f"{coordinator_host}:{port}",
        accelerator_type=(accelerator_type or "").strip() or None,
        host=hosts[worker].split(":")[0],
    )


#: The environment a Compute Engine TPU VM's trainer unit gets from ``boot.sh`` (JAX's
#: ``GkeTpuCluster`` reads the first two, ``BaseTpuCluster`` the ``MEGASCALE_*`` ones).
WORKER_ID_ENV = "TPU_WORKER_ID"
WORKER_HOSTNAMES_ENV = "TPU_WORKER_HOSTNAMES"
PROCESS_ADDRESSES_ENV = "TPU_PROCESS_ADDRESSES"
MEGASCALE_COORDINATOR_ENV = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES_ENV = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID_ENV = "MEGASCALE_SLICE_ID"
#: The accelerator type on a Compute Engine TPU VM (Cloud TPU's ``accelerator-type`` is not set).
COMPUTE_ENGINE_ACCELERATOR_KEY = "multislice-accelerator-type"


def _count(name: str, text: str | None, default: int | None = None) -> int:
    """``text`` as a non-negative integer; ``default`` when it is None or empty."""
    if text is None or not text.strip():
        if default is None:
            raise MetadataError(f"{name} is not set")
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise MetadataError(f"{name}={text!r} is not an integer") from None
    if value < 0:
        raise MetadataError(f"{name}={text!r} is negative")
    return value


def identity_from_environment(
    environ: Mapping[str, str] | None = None, *, accelerator_type: str | None = None
) -> ClusterIdentity:
    """This VM's identity from ``TPU_WORKER_ID``, ``TPU_PROCESS_ADDRESSES`` or
    ``TPU_WORKER_HOSTNAMES``, and ``MEGASCALE_*``.

    Mirrors ``GkeTpuCluster`` (worker = ``int(TPU_WORKER_ID)``, hosts = the comma split of
    ``TPU_PROCESS_ADDRESSES`` if set, else of ``TPU_WORKER_HOSTNAMES``: its
    ``_get_worker_host_names_env_var``) and ``BaseTpuCluster`` (slices = ``MEGASCALE_NUM_SLICES`` or 1,
    slice = ``MEGASCALE_SLICE_ID`` or 0, coordinator = ``MEGASCALE_COORDINATOR_ADDRESS`` or the
    slice's first host, without any port) of ``jax/_src/clusters/cloud_tpu_cluster.py``; the
    port is :func:`identity_from_metadata`'s.

    Args:
      environ: the environment (default ``os.environ``).
      accelerator_type: e.g. ``v5p-8``, when known.

    Raises:
      MetadataError: a value is missing or malformed (names the variable).
    """
    env = os.environ if environ is None else environ
    hosts_name = PROCESS_ADDRESSES_ENV if env.get(PROCESS_ADDRESSES_ENV) is not None else WORKER_HOSTNAMES_ENV
    hosts_text = env.get(hosts_name)
    if hosts_text is None:
        raise MetadataError(f"{WORKER_HOSTNAMES_ENV} is not set")
    hosts = [host.strip() for host in hosts_text.split(",")]
    if not all(hosts):
        raise MetadataError(f"{hosts_name}={hosts_text!r} has an empty entry")
    worker = _count(WORKER_ID_ENV, env.get(WORKER_ID_ENV))
    num_slices = _count(MEGASCALE_NUM_SLICES_ENV, env.get(MEGASCALE_NUM_SLICES_ENV), 1)
    slice_id = _count(MEGASCALE_SLICE_ID_ENV, env.get(MEGASCALE_SLICE_ID_ENV), 0)
    if worker >= len(hosts):
        raise MetadataError(f"{WORKER_ID_ENV} {worker} is outside the slice's {len(hosts)} workers")
    if num_slices < 1 or slice_id >= num_slices:
        raise MetadataError(f"{MEGASCALE_SLICE_ID_ENV} {slice_id} is outside {MEGASCALE_NUM_SLICES_ENV} {num_slices}")
    coordinator_host = (env.get(MEGASCALE_COORDINATOR_ENV) or hosts[0]).split(":")[0]
    port = coordinator_port(env)
    return ClusterIdentity(
        worker=worker,
        workers_per_slice=len(hosts),
        slice_id=slice_id,
        num_slices=num_slices,
        coordinator_address=f"{coordinator_host}:{port}",
        accelerator_type=(accelerator_type or "").strip() or None,
        host=hosts[worker].split(":")[0],
    )


#: Where this VM's identity is, as the boot wrote it into the trainer's unit from the stack's
#: backend: one of :data:`IDENTITY_SOURCES`.
IDENTITY_ENV = "MULTISLICE_IDENTITY"
IDENTITY_SOURCES = ("metadata", "environment")


def identity_in_environment() -> bool:
    """Whether this VM's identity is in the environment: ``MULTISLICE_IDENTITY`` says so
    (``environment``) or not (``metadata``); without it, whether ``TPU_WORKER_HOSTNAMES`` or
    ``TPU_PROCESS_ADDRESSES`` is set.

    Raises:
      MetadataError: ``MULTISLICE_IDENTITY`` holds another value.
    """
    source = os.environ.get(IDENTITY_ENV, "").strip()
    if not source:
        return WORKER_HOSTNAMES_ENV in os.environ or PROCESS_ADDRESSES_ENV in os.environ
    if source not in IDENTITY_SOURCES:
        raise MetadataError(f"{IDENTITY_ENV}={source!r} is not one of {', '.join(IDENTITY_SOURCES)}")
    return source == IDENTITY_SOURCES[1]


def current_identity() -> ClusterIdentity:
    """This VM's identity: :func:`identity_from_environment` when it is in the environment (a
    Compute Engine TPU VM: :func:`identity_in_environment`), else :func:`identity_from_metadata`
    (a queued resource's).

    Raises:
      MetadataError: a required value is missing or malformed.
    """
    if identity_in_environment():
        accelerator_type = get_metadata(COMPUTE_ENGINE_ACCELERATOR_KEY, required=False)
        return identity_from_environment(accelerator_type=accelerator_type)
    return identity_from_metadata()


def initialize(identity: ClusterIdentity) -> None:
    """Start ``jax.distributed`` with explicit values and timeouts (never auto-detection).

    A single-process identity does nothing. Timeouts come from the environment knobs in
    the module docstring.
    """
    if identity.num_processes == 1:
        return
    import jax

    init_timeout = knobs.integer("MULTISLICE_INIT_TIMEOUT_S", DEFAULT_INIT_TIMEOUT_S)
    heartbeat = knobs.integer("MULTISLICE_HEARTBEAT_TIMEOUT_S", DEFAULT_HEARTBEAT_TIMEOUT_S)
    log.info(
        "jax.distributed.initialize coordinator=%s process %d/%d (init timeout %ds, heartbeat %ds)",
        identity.coordinator_address,
        identity.process_id,
        identity.num_processes,
        init_timeout,
        heartbeat,
    )
    jax.distributed.initialize(
        coordinator_address=identity.coordinator_address,
        num_processes=identity.num_processes,
        process_id=identity.process_id,
        cluster_detection_method="deactivate",
        initialization_timeout=init_timeout,
        heartbeat_timeout_seconds=heartbeat,
    )
