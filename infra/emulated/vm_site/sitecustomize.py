"""Run at the start of every Python of an emulated TPU VM (``site`` imports ``sitecustomize``
from ``sys.path``: https://docs.python.org/3/library/site.html; the emulation puts this directory
on the VM's ``PYTHONPATH``, and the VM's service manager keeps it there for every unit,
``infra.emulated.service_manager``). It stands in for what libtpu and the TPU runtime do on a Cloud
TPU VM, for the four things a JAX program there can observe
(docs/emulation.md, "What a JAX program on an emulated VM sees"):

1. **The cluster.** On a Cloud TPU VM JAX finds its cluster through ``GceTpuCluster``
   (``jax/_src/clusters/cloud_tpu_cluster.py``): the process id, process count and coordinator
   come from the GCE metadata server (``agent-worker-number``, ``worker-network-endpoints``,
   ``tpu-env`` with the ``MEGASCALE_*`` values), at ``$GCE_METADATA_IP`` when set. Every emulated
   VM has such a server (``infra.local.topology``). But ``GceTpuCluster.is_env_present`` also
   requires ``running_in_cloud_tpu_vm`` (libtpu and TPU chips found), which never holds on CPU.
   So once ``jax._src.clusters.cloud_tpu_cluster`` is imported, ``EmulatedTpuCluster`` is
   defined: a ``GceTpuCluster`` whose ``is_env_present`` asks only the metadata server.
   ``ClusterEnv`` registers every subclass when it is defined (``__init_subclass__``). The
   coordinator's port is ``$JAX_COORDINATOR_PORT`` (a TPU VM uses JAX's 8482).
   A Compute Engine TPU VM (``multislice:backend: compute-engine``) has none of those metadata
   keys: its ``boot.sh`` writes ``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES`` and the
   ``MEGASCALE_*`` values into the trainer's environment, where JAX's ``GkeTpuCluster`` reads
   them (``BaseTpuCluster.get_tpu_env_value``: the environment first). Its ``is_env_present``
   requires ``running_in_cloud_tpu_vm`` too, so ``EmulatedGkeTpuCluster`` is defined beside it:
   a ``GkeTpuCluster`` whose ``is_env_present`` reads only the environment. It is defined
   first, so it is asked first (``auto_detect_unset_distributed_params`` takes the first
   registered cluster present), as JAX asks ``GkeTpuCluster`` before ``GceTpuCluster``.

2. **Every chip of every host, without ``jax.distributed.initialize()``.** On Cloud TPU the call
   is optional: "On Cloud TPU, Slurm, Open MPI and Kubernetes environments, you can simply call
   jax.distributed.initialize() with no arguments" and a program that never calls it still sees
   every device of the slice (the TPU runtime discovers its hosts; the ``MEGASCALE_*`` values
   link the slices: https://docs.jax.dev/en/latest/multi_process.html). On CPU nothing does
   that, so when a program's JAX first creates its backends without having initialized the
   distributed runtime, and the VM's metadata names more than one process, this hook calls
   ``jax.distributed.initialize()`` first, as the TPU runtime would have joined the job.

3. **The chips belong to one process.** libtpu takes an exclusive ``lockf`` on
   ``/tmp/libtpu_lockfile`` when it loads and holds it until the process exits
   (tensorflow/core/tpu/tpu_initializer_helper.cc ``TryAcquireTpuLock``); a second JAX
   process on the VM fails with "ABORTED: The TPU is already in use by process with pid N"
   (jax-ml/jax issue 13260). Here each VM's lock file is ``$MULTISLICE_HOME/tmp/libtpu_lockfile``,
   taken (with the same ``lockf``) before a process joins a distributed job or creates its
   backends; a second process gets the same message and never reaches the run's coordinator. So
   ``multislice local exec`` of a JAX program while the run trains fails on each worker with
   that message and the run is untouched, as on a TPU VM; the lock goes with the process that
   held it, however it ended (``lockf`` locks are released when the process exits).

4. **Every chip knows its slice.** On Cloud TPU every device carries ``slice_index``, the slice
   it belongs to, and the field's multislice programs lay out their mesh from it:
   ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` groups devices by it unless told
   ``process_is_granule``, and MaxText's ``pedagogical_examples/shardings.py`` (the Multislice
   overview's experiment) asserts its slice count equals ``1 + max(d.slice_index)``. XLA's CPU
   client gives its devices none in a single process, and in a job of several processes gives
   every device of one machine the same one (IFRT's ``PjRtClient::Create`` numbers slices by
   ``/proc/sys/kernel/random/boot_id``: one per host), so every emulated chip would say slice 0.
   When ``jax._src.xla_bridge`` is loaded, ``jax.Device`` gets a ``slice_index`` property: for
   a CPU device, ``process_index // (processes / slices)``, the slices being
   ``$MULTISLICE_EMULATED_SLICES`` (the emulated job's, ``infra.local.topology.vm_environment``)
   and the processes those of the job the program is in; JAX numbers a Multislice job's
   processes slice after slice (``BaseTpuCluster.get_process_id``: ``worker + slice ×
   workers per slice``). Any other device, or a job whose processes do not split evenly into
   the slices, keeps what XLA gives it. ``coords`` and ``core_on_chip`` stay absent: JAX's mesh
   utilities read them only for ``platform == "tpu"``, and lay out CPU devices in the order given.

Nothing is imported before the program imports JAX itself, and nothing happens unless
``MULTISLICE_EMULATED_TPU`` is set (the emulated VMs' environment).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Set in every emulated VM's environment (``infra.local.topology.vm_environment``).
EMULATED_TPU_ENV = "MULTISLICE_EMULATED_TPU"
#: The emulated job's slice count, in the same environment (point 4).
SLICES_ENV = "MULTISLICE_EMULATED_SLICES"
#: The VM's local disk (``infra.vm_contract.HOME_ENV``).
HOME_ENV = "MULTISLICE_HOME"
#: The lock file under the VM's local disk, as libtpu's ``/tmp/libtpu_lockfile`` on a TPU VM.
LOCKFILE = os.path.join("tmp", "libtpu_lockfile")
#: The module that defines ``GceTpuCluster``, where the distributed runtime starts, and where
#: the backends are created.
CLUSTERS = "jax._src.clusters.cloud_tpu_cluster"
DISTRIBUTED = "jax._src.distributed"
XLA_BRIDGE = "jax._src.xla_bridge"

_lock_fd: int | None = None


class TpuInUse(RuntimeError):
    """Another process of this emulated VM holds its chips (libtpu's lock)."""


def lock_path() -> str | None:
    """This VM's lock file, or None outside an emulated VM (no ``$MULTISLICE_HOME``)."""
    home = os.environ.get(HOME_ENV)
    return os.path.join(home, LOCKFILE) if home else None


def acquire_chips() -> None:
    """Take this VM's chips for this process, once (a second call does nothing).

    Raises:
      TpuInUse: another live process holds them (the message names its pid, as libtpu's does).
    """
    global _lock_fd
    path = lock_path()
    if _lock_fd is not None or path is None:
        return
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise TpuInUse(
            f"Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid {holder}. "
            "Not attempting to load libtpu.so in this process. (multislice emulation: on this emulated TPU VM, as "
            "on a real one, the chips belong to one process, here the stack's run; stop it first with "
            f"`{os.environ.get('MULTISLICE_LOCAL_DOWN') or 'multislice local down'}`, or run a command that does not "
            "use JAX)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _lock_fd = fd


def _distributed_initialized() -> bool:
    distributed = sys.modules.get(DISTRIBUTED)
    return distributed is not None and distributed.global_state.client is not None


def _join_as_the_tpu_runtime_would() -> None:
    """``jax.distributed.initialize()`` when the VM's metadata names a job of more than one
    process and this program has not joined one (see the module docstring, point 2)."""
    if _distributed_initialized():
        return
    from jax._src.clusters import cloud_tpu_cluster

    names = ("EmulatedGkeTpuCluster", "EmulatedTpuCluster")  # JAX's order: the environment first
    found = [c for c in (getattr(cloud_tpu_cluster, n, None) for n in names) if c is not None and c.is_env_present()]
    if not found or found[0].get_process_count() < 2:
        return
    import jax

    jax.distributed.initialize()


def register_cluster(module: Any) -> None:
    """Define ``EmulatedGkeTpuCluster`` on top of ``module.GkeTpuCluster``, then
    ``EmulatedTpuCluster`` on top of ``module.GceTpuCluster`` (point 1)."""

    class EmulatedGkeTpuCluster(module.GkeTpuCluster):
        name = "emulatedgketpu"

        @classmethod
        def is_env_present(cls) -> bool:
            return bool(os.environ.get(EMULATED_TPU_ENV)) and cls._get_worker_host_names_env_var() is not None

    module.EmulatedGkeTpuCluster = EmulatedGkeTpuCluster

    class EmulatedTpuCluster(module.GceTpuCluster):
        name = "emulatedtpu"

        @classmethod
        def is_env_present(cls) -> bool:
            if not os.environ.get(EMULATED_TPU_ENV):
                return False
            try:
                return module.get_metadata("agent-worker-number")[1] == module.metadata_response_code_success
            except Exception:  # no metadata server: not an emulated TPU VM
                return False

    module.EmulatedTpuCluster = EmulatedTpuCluster


def guard_distributed(module: Any) -> None:
    """``jax.distributed.initialize`` takes the VM's chips before it reaches any coordinator
    (point 3): a second process never joins, confuses or ends the run's job."""
    initialize: Callable[..., Any] = module.initialize

    def guarded(*args: Any, **kwargs: Any) -> Any:
        acquire_chips()
        return initialize(*args, **kwargs)

    functools.update_wrapper(guarded, initialize)
    module.initialize = guarded


def guard_backends(module: Any) -> None:
    """The first creation of JAX's backends takes the VM's chips (point 3) and, where the
    program joined no job, joins the VM's (point 2)."""
    backends: Callable[[], Any] = module.backends
    first = [True]

    def guarded() -> Any:
        if first[0] and not module.backends_are_initialized():
            first[0] = False  # before the join: initialize() must not come back here
            acquire_chips()
            _join_as_the_tpu_runtime_would()
        return backends()

    functools.update_wrapper(guarded, backends)
    module.backends = guarded


def emulated_slice_index(device: Any) -> int:
    """The slice whose emulated VM owns ``device``, a CPU device of this job (point 4).

    Raises:
      AttributeError: ``device`` is no CPU device, or the job's processes do not split evenly
        into ``$MULTISLICE_EMULATED_SLICES`` slices; Python then asks XLA's own attributes
        (``jax.Device.__getattr__``), as it does for a device without this property.
    """
    client = device.client
    processes = client.device_count() // max(1, client.local_device_count())
    slices = int(os.environ.get(SLICES_ENV) or "1")
    if device.platform != "cpu" or slices < 1 or processes % slices:
        raise AttributeError("slice_index")
    return int(device.process_index) // (processes // slices)


def give_chips_their_slice(module: Any) -> None:
    """``jax.Device.slice_index`` from the emulated topology (point 4), then the backends' guard."""
    module._jax.Device.slice_index = property(emulated_slice_index, doc=emulated_slice_index.__doc__)
    guard_backends(module)


HOOKS: dict[str, Callable[[ModuleType], None]] = {
    CLUSTERS: register_cluster,
    DISTRIBUTED: guard_distributed,
    XLA_BRIDGE: give_chips_their_slice,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], None]) -> None:
        self.loader, self.hook = loader, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.hook(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of the modules of :data:`HOOKS` so that each hook runs right after its
    module is executed, before anything imports names from it."""

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = HOOKS.get(fullname)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, hook)
        return spec


if os.environ.get(EMULATED_TPU_ENV):
    sys.meta_path.insert(0, _Finder())
