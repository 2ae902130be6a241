"""What each emulated TPU VM is told about its place in the queued resource.

A TPU VM of a queued resource learns its place from GCE metadata; the emulator serves the
same keys (``infra.local.metadata``), with the values a real TPU VM of the stack would get:

* ``agent-worker-number``: the worker index inside the slice;
* ``worker-network-endpoints``: ``<node>-w-<i>:<i>:<ip>`` for each worker of the slice
  (every worker is 127.0.0.1 here);
* ``tpu-env``: ``ACCELERATOR_TYPE``, ``WORKER_ID``, ``NODE_ID`` and, for more than one
  slice, the ``MEGASCALE_*`` values of a multislice queued resource;
* ``accelerator-type``, ``startup-script``, and this project's ``multislice-run-dir``: the
  stack's ``gs://<bucket>/runs/<run>``, as ``pulumi up`` sets it; the emulated Cloud Storage
  serves it (``infra.local.gcs``), found through the environment (:func:`vm_environment`);
* with ``multislice:queuedResource.deleteOnComplete``, ``multislice-delete-queued-resource``:
  the queued resource's name, from the same function as ``pulumi up``
  (:func:`infra.startup.contract.delete_on_complete_metadata`); worker 0 of slice 0 deletes it
  through the emulated TPU API once the run is complete (``infra.local.tpu_api``).

The node (slice) names are the stack's real ones, :attr:`infra.config.StackConfig.node_ids`,
the ids the queued resource's nodes get on Cloud TPU.

A ``multislice:backend: compute-engine`` stack's VMs get none of Cloud TPU's keys; they get what
``pulumi up`` puts in its instance template and its groups (docs/compute-engine.md), and find
their place themselves through the emulated Compute API (``infra.local.compute_api``), as
``boot.sh`` does on Compute Engine (:func:`compute_engine_metadata`, :func:`compute_engine_values`,
:func:`compute_engine_names`). deleteOnComplete is not built for that backend, so its VMs never
get ``multislice-delete-queued-resource``.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from infra.config import StackConfig
from infra.local.compute_api import instance_name
from infra.local.service_manager import VM_SITE_ENV
from infra.local.state import EMULATION_ID_ENV
from infra.startup import contract

#: Port part of ``MEGASCALE_COORDINATOR_ADDRESS`` as a queued resource sets it (JAX replaces it).
MEGASCALE_PORT = 8080
#: Environment prefixes the emulator's own environment may carry but a VM must not inherit.
#: The trainer's ``training.compile_cache.SHARED_DIR_ENV``: passed on to the VMs when set.
SHARED_COMPILATION_CACHE_ENV = contract.COMPILATION_CACHE_ENV
_HOST_ONLY_PREFIXES = ("JAX_", "XLA_", "MULTISLICE_", "GCE_METADATA", "TPU_", "MEGASCALE_")
#: The directory whose ``sitecustomize.py`` makes ``jax.distributed.initialize()`` (no arguments)
#: find the emulated job through the VM's metadata server, as it finds a TPU VM's job.
VM_SITE_DIR = Path(__file__).resolve().parent / "vm_site"
#: What tells that hook it runs in an emulated VM.
EMULATED_TPU_ENV = "MULTISLICE_EMULATED_TPU"


#: The project number in an emulated VM's ``instance/zone`` (``projects/<number>/zones/<zone>``,
#: https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys): a placeholder.
EMULATED_PROJECT_NUMBER = "123456789012"
#: Every emulated VM's internal IP (they all run on this machine).
EMULATED_VM_IP = "127.0.0.1"


def is_compute_engine(config: StackConfig) -> bool:
    """Whether the stack's VMs come from managed instance groups (``multislice:backend``)."""
    return config.backend == contract.COMPUTE_ENGINE_BACKEND


def compute_engine_metadata(config: StackConfig, slice_id: int, *, startup_script: str, run_dir: str) -> dict[str, str]:
    """A compute-engine backend VM's metadata attributes: the instance template's (the startup
    script, the run directory, the backend, the groups in slice order, the VMs per slice, the
    accelerator type) and its group's (the slice index)."""
    return {
        **contract.node_metadata(
            startup_script=startup_script,
            run_dir=run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=False,
        ),
        contract.BACKEND_KEY: contract.COMPUTE_ENGINE_BACKEND,
        contract.INSTANCE_GROUPS_KEY: ",".join(config.node_ids),
        contract.WORKERS_PER_SLICE_KEY: str(config.accelerator.hosts),
        contract.COMPUTE_ENGINE_ACCELERATOR_KEY: config.accelerator.name,
        contract.SLICE_ID_KEY: str(slice_id),
    }


def compute_engine_values(config: StackConfig, name: str) -> dict[str, str]:
    """The other metadata a compute-engine backend VM's ``boot.sh`` reads (paths under
    ``/computeMetadata/v1/``): its name, zone and project."""
    return {
        "instance/name": name,
        "instance/zone": f"projects/{EMULATED_PROJECT_NUMBER}/zones/{config.zone}",
        "project/project-id": config.project,
    }


def compute_engine_names(config: StackConfig, rng: random.Random | None = None) -> list[list[str]]:
    """For each slice, its group's VM names as a managed instance group makes them
    (``<group>-<4 of [a-z0-9]>``), sorted: worker ``i`` is the ``i``-th, as ``boot.sh`` counts."""
    rng = rng or random.Random()
    slices = []
    for group in config.node_ids:
        names: set[str] = set()
        while len(names) < config.accelerator.hosts:
            names.add(instance_name(group, rng))
        slices.append(sorted(names))
    return slices


def vm_metadata(
    config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
) -> dict[str, str]:
    """The metadata attributes of worker ``worker`` of slice ``slice_id`` (keys as on GCE; a
    compute-engine backend VM's are :func:`compute_engine_metadata`)."""
    if is_compute_engine(config):
        return compute_engine_metadata(config, slice_id, startup_script=startup_script, run_dir=run_dir)
    acc = config.accelerator
    node = config.node_ids[slice_id]
    endpoints = ",".join(f"{node}-w-{i}:{i}:127.0.0.1" for i in range(acc.hosts))
    tpu_env = [
        f"ACCELERATOR_TYPE: '{acc.name}'",
        f"WORKER_ID: '{worker}'",
        f"NODE_ID: '{node}'",
    ]
    if config.slices > 1:
        tpu_env += [
            f"MEGASCALE_COORDINATOR_ADDRESS: '127.0.0.1:{MEGASCALE_PORT}'",
            f"MEGASCALE_NUM_SLICES: '{config.slices}'",
            f"MEGASCALE_SLICE_ID: '{slice_id}'",
            f"MEGASCALE_PORT: '{MEGASCALE_PORT}'",
        ]
    return {
        contract.WORKER_NUMBER_KEY: str(worker),
        contract.WORKER_ENDPOINTS_KEY: endpoints,
        contract.TPU_ENV_KEY: "\n".join(tpu_env) + "\n",
        contract.ACCELERATOR_TYPE_KEY: acc.name,
        **contract.node_metadata(
            startup_script=startup_script,
            run_dir=run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=config.delete_on_complete,
        ),
    }


def vm_environment(
    config: StackConfig,
    *,
    emulation_id: str,
    coordinator_port: int,
    heartbeat_timeout_s: int,
    init_timeout_s: int,
    storage_env: dict[str, str],
    bytecode_dir: Path | None = None,
) -> dict[str, str]:
    """The environment every emulated VM's startup script runs with: this process's, less
    JAX / TPU / metadata settings, plus the emulation's (CPU devices, this virtualenv's
    Python, the coordinator port, the run's emulation id) and ``storage_env``, which points
    the Cloud Storage clients at the emulated server (:meth:`infra.local.gcs.GcsServer.client_env`).
    ``MULTISLICE_COMPILATION_CACHE_DIR``, when set here, is passed on: the VMs then use that
    compilation cache instead of the stack's ``gs://<bucket>/compilation-cache``, which the
    startup script gives them otherwise (:mod:`training.compile_cache`).
    Where this process has ``PYTHONDONTWRITEBYTECODE`` set (some CI images and sandboxes), the
    VMs keep their bytecode in ``bytecode_dir`` instead (``PYTHONPYCACHEPREFIX``,
    https://docs.python.org/3/using/cmdline.html): a TPU VM's Python caches what it compiled on
    its first start, and without it every emulated start would compile each module of jax,
    orbax and the rest from source (seconds of CPU per process), while nothing is written into
    this machine's source tree or virtualenv, as the variable asks.
    ``PYTHONPATH`` starts with :data:`VM_SITE_DIR` and ``MULTISLICE_EMULATED_TPU`` and
    ``JAX_COORDINATOR_PORT`` are set: a stack's own command calling ``jax.distributed.initialize()``
    without arguments, or not at all, joins the emulated job, and the VM's chips belong to one
    process at a time (docs/workloads.md; vm_site/sitecustomize.py). ``MULTISLICE_VM_SITE`` keeps
    that directory on the ``PYTHONPATH`` of units that set their own, the trainer's included
    (``infra.local.service_manager.unit_environment``)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_HOST_ONLY_PREFIXES)}
    env.update(
        {
            EMULATION_ID_ENV: emulation_id,
            contract.PYTHON_ENV: sys.executable,
            contract.COORDINATOR_PORT_ENV: str(coordinator_port),
            contract.HEARTBEAT_TIMEOUT_ENV: str(heartbeat_timeout_s),
            contract.INIT_TIMEOUT_ENV: str(init_timeout_s),
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": str(config.accelerator.chips_per_host),
            # A stack's own command: jax.distributed.initialize() auto-detects the emulated job
            # (vm_site/sitecustomize.py) and JAX takes the coordinator's port from here.
            EMULATED_TPU_ENV: "1",
            "JAX_COORDINATOR_PORT": str(coordinator_port),
            "PYTHONPATH": os.pathsep.join(p for p in (str(VM_SITE_DIR), os.environ.get("PYTHONPATH", "")) if p),
            VM_SITE_ENV: str(VM_SITE_DIR),
            "PYTHONUNBUFFERED": "1",
            **storage_env,
        }
    )
    if shared_cache := os.environ.get(SHARED_COMPILATION_CACHE_ENV):  # runs share compiled programs
        env[SHARED_COMPILATION_CACHE_ENV] = shared_cache
    if bytecode_dir is not None and env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = str(bytecode_dir)
    return env
