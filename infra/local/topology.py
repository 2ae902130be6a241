"""What each emulated TPU VM is told about its place in the job, and the environment it runs in.

A TPU VM learns its place from GCE metadata; the emulator serves the keys the stack's backend
gives its VMs (:func:`vm_metadata`: the backend's own, :meth:`infra.backends.interface.Backend.vm_metadata`;
a queued resource's VMs get Cloud TPU's keys, :mod:`infra.backends.queued_resource.emulation`, a
compute-engine stack's VMs get its instance template's and groups', and find their place through
the emulated Compute API, :mod:`infra.backends.compute_engine.emulation`), with the values a real
VM of the stack would get; the emulated Cloud Storage serves the run directory (``infra.emulated.gcs``),
found through the environment (:func:`vm_environment`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from infra import invocation, vm_contract as contract
from infra.backends.operations import backend_of
from infra.config import StackConfig
from infra.emulated.service_manager import VM_SITE_ENV
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths

#: The trainer's ``training.compile_cache.SHARED_DIR_ENV``: passed on to the VMs when set.
SHARED_COMPILATION_CACHE_ENV = contract.COMPILATION_CACHE_ENV
#: ``XLA_FLAGS`` for the emulated VMs' processes, when set here. This process's own ``XLA_FLAGS``
#: is never passed on (a TPU VM's trainer has none of the operator's machine's settings); the
#: tests use this to compile the VMs' programs as they compile their own (tests/compile_flags.py).
VM_XLA_FLAGS_ENV = "MULTISLICE_EMULATED_XLA_FLAGS"
#: Environment prefixes the emulator's own environment may carry but a VM must not inherit.
_HOST_ONLY_PREFIXES = ("JAX_", "XLA_", "MULTISLICE_", "GCE_METADATA", "TPU_", "MEGASCALE_")
#: The directory whose ``sitecustomize.py`` makes ``jax.distributed.initialize()`` (no arguments)
#: find the emulated job through the VM's metadata server, as it finds a TPU VM's job.
VM_SITE_DIR = Path(__file__).resolve().parents[1] / "emulated" / "vm_site"
#: What tells that hook it runs in an emulated VM.
EMULATED_TPU_ENV = "MULTISLICE_EMULATED_TPU"
#: The emulated job's slice count, from which that hook gives each chip its ``slice_index``.
EMULATED_SLICES_ENV = "MULTISLICE_EMULATED_SLICES"
#: The command that stops the emulation, as the user's shell runs it (infra/invocation.py): what a
#: VM's message names (vm_site/sitecustomize.py), which cannot know how the CLI was started.
LOCAL_DOWN_ENV = "MULTISLICE_LOCAL_DOWN"


def vm_metadata(
    config: StackConfig, slice_id: int, worker: int, *, startup_script: str, run_dir: str
) -> dict[str, str]:
    """The metadata attributes of worker ``worker`` of slice ``slice_id`` (keys as on GCE), as the
    stack's backend gives them to its VMs (:meth:`infra.backends.interface.Backend.vm_metadata`)."""
    return backend_of(config).vm_metadata(config, slice_id, worker, startup_script=startup_script, run_dir=run_dir)


#: Seconds between two heartbeats of an elastic run's emulated trainers (10 on a VM: training.heartbeats):
#: a lost slice shows within three of them, so a short ``shrinkAfter`` is honoured.
ELASTIC_HEARTBEAT_S = 1.0


def vm_environment(
    config: StackConfig,
    *,
    emulation_id: str,
    coordinator_port: int,
    heartbeat_timeout_s: int,
    init_timeout_s: int,
    storage_env: dict[str, str],
    paths: LocalPaths | None = None,
) -> dict[str, str]:
    """The environment every emulated VM's startup script runs with: this process's, less
    JAX / TPU / metadata settings, plus the emulation's (CPU devices, this virtualenv's
    Python, the coordinator port, the run's emulation id) and ``storage_env``, which points
    the Cloud Storage clients at the emulated server (:meth:`infra.emulated.gcs.GcsServer.client_env`).
    ``MULTISLICE_COMPILATION_CACHE_DIR``, when set here, is passed on: the VMs then use that
    compilation cache instead of the stack's ``gs://<bucket>/compilation-cache``, which the
    startup script gives them otherwise (:mod:`training.compile_cache`); ``XLA_FLAGS`` is
    :data:`VM_XLA_FLAGS_ENV`'s value, when set here, else unset.
    Where this process has ``PYTHONDONTWRITEBYTECODE`` set (some CI images and sandboxes), the
    VMs keep their bytecode in ``paths.bytecode_dir`` instead (``PYTHONPYCACHEPREFIX``,
    https://docs.python.org/3/using/cmdline.html): a TPU VM's Python caches what it compiled on
    its first start, and without it every emulated start would compile each module of jax,
    orbax and the rest from source (seconds of CPU per process), while nothing is written into
    this machine's source tree or virtualenv, as the variable asks.
    ``PYTHONPATH`` starts with :data:`VM_SITE_DIR` and ``MULTISLICE_EMULATED_TPU`` and
    ``JAX_COORDINATOR_PORT`` are set: a stack's own command calling ``jax.distributed.initialize()``
    without arguments, or not at all, joins the emulated job, and the VM's chips belong to one
    process at a time (docs/workloads.md; vm_site/sitecustomize.py). ``MULTISLICE_VM_SITE`` keeps
    that directory on the ``PYTHONPATH`` of units that set their own, the trainer's included
    (``infra.emulated.service_manager.unit_environment``). The VMs' ``python3`` is this machine's,
    without a version manager's shim in front (:func:`python3_dir`, in ``paths.python3_dir``)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_HOST_ONLY_PREFIXES)}
    env.update(
        {
            EMULATION_ID_ENV: emulation_id,
            contract.PYTHON_ENV: sys.executable,
            contract.COORDINATOR_PORT_ENV: str(coordinator_port),
            contract.HEARTBEAT_TIMEOUT_ENV: str(heartbeat_timeout_s),
            contract.INIT_TIMEOUT_ENV: str(init_timeout_s),
            contract.ELASTIC_HEARTBEAT_ENV: str(ELASTIC_HEARTBEAT_S),
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": str(config.accelerator.chips_per_host),
            # A stack's own command: jax.distributed.initialize() auto-detects the emulated job
            # (vm_site/sitecustomize.py) and JAX takes the coordinator's port from here.
            EMULATED_TPU_ENV: "1",
            EMULATED_SLICES_ENV: str(config.slices),  # each chip's slice_index (sitecustomize.py)
            LOCAL_DOWN_ENV: invocation.command("local down", config.stack),
            "JAX_COORDINATOR_PORT": str(coordinator_port),
            "PYTHONPATH": os.pathsep.join(p for p in (str(VM_SITE_DIR), os.environ.get("PYTHONPATH", "")) if p),
            VM_SITE_ENV: str(VM_SITE_DIR),
            "PYTHONUNBUFFERED": "1",
            **storage_env,
        }
    )
    if vm_flags := os.environ.get(VM_XLA_FLAGS_ENV):
        env["XLA_FLAGS"] = vm_flags
    if shared_cache := os.environ.get(SHARED_COMPILATION_CACHE_ENV):  # runs share compiled programs
        env[SHARED_COMPILATION_CACHE_ENV] = shared_cache
    if paths is not None and env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = str(paths.bytecode_dir)
    if paths is not None and (python3 := python3_dir(paths.python3_dir, env.get("PATH", os.defpath))) is not None:
        env["PATH"] = os.pathsep.join((str(python3), env.get("PATH", os.defpath)))
    return env


def python3_dir(directory: Path, path: str) -> Path | None:
    """``directory``, holding a ``python3`` link to the interpreter that ``python3`` on ``path``
    runs, when that ``python3`` is a script: a version manager's shim (pyenv's is a bash script
    that finds the interpreter anew on every call). The VMs' scripts call ``python3`` often (a
    compute-engine VM reads each Compute API answer with it, every few seconds; every boot
    decodes its bundle with it), and through pyenv's shim each call cost 0.097 CPU-s instead of
    0.035 (docs/emulation.md, "Measured"); a TPU VM's ``python3`` is the system's interpreter.
    Resolved once, by asking that ``python3`` for its ``sys.executable``. None, and nothing
    written, when ``python3`` is not on ``path`` or is not a script, or does not answer."""
    found = shutil.which("python3", path=path)
    if found is None:
        return None
    try:
        with open(found, "rb") as f:
            if f.read(2) != b"#!":
                return None
        answer = subprocess.run(
            [found, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    interpreter = answer.stdout.strip()
    if not os.path.isabs(interpreter) or not os.access(interpreter, os.X_OK):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / f".python3.{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(interpreter)
    staged.replace(directory / "python3")  # atomic: a VM never finds the link half made
    return directory
