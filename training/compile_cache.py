"""JAX's persistent compilation cache in the run directory: a restarted process skips the compile.

Every restart (a preemption, a crash, a slice recreated by auto-repair) used to pay the full
XLA compile of the train step again. JAX can persist compiled executables and look them up by
a key over the program, the devices and the compile options
(https://docs.jax.dev/en/latest/persistent_compilation_cache.html); the directory may be a
local path or any URI etils.epath opens, ``gs://`` included. We keep it in the run
directory (``<run_dir>/compilation_cache``), so a recreated slice, whose VMs get fresh disks,
still finds it in the bucket. In a multi-process job only process 0 writes entries (JAX's
``_cache_write`` in jax/_src/compiler.py: "Only write cache entries from the first process"),
and the other processes read them: a process finds an entry only if its key equals process
0's key. On the CPU backend (the local emulation) it never does: one part of the key, the
accelerator configuration (jax/_src/cache_key.py ``_hash_accelerator_config``, XLA's topology
fingerprint of the job's devices), differs per process. Measured on a 2-process CPU job over
the same 4 devices: fingerprint 2750224376234440577 in process 0, 17646727468347767552 in
process 1; the program, versions, flags and compile options hash alike (the
``jax._src.cache_key`` logger at DEBUG prints each part's hash). So on CPU every process but 0
compiled every program at every start, and each restart waited for that compile.
:func:`enable` therefore keys CPU devices by what identifies them in the job (kind, global id,
process index; the device assignment in the compile options already fixes their order), the
same in every process, through JAX's private ``_hash_accelerator_config`` (jax is pinned below
0.11 in pyproject.toml; without that function the cache works as before). Other platforms
keep JAX's own key: whether TPU processes share it was not measured here (no TPU).
Measured after the change: in the 2-process job run twice, process 1 loaded the entry process
0 wrote and computed the same result (tests/training/test_compile_cache.py).
``jax_share_binary_between_hosts`` (off by default) is not used: by jax/_src/compiler.py, the
others would wait for process 0 to share an executable that it loaded from the cache instead
of compiling, and never shares.

Several runs may share one cache instead: with ``MULTISLICE_COMPILATION_CACHE_DIR`` set in the
trainer's environment, that directory is used, whatever the run directory (the cache key
covers the program, so runs of another model or mesh only add entries). The local emulation
passes the variable on to its VMs; the test suite sets it so that its many short runs of the
same model compile each program once.

The cache is trusted code (JAX's ``set_cache_dir`` docstring: "Do not share a compilation
cache with users you do not trust"); the run directory is in the stack's private bucket,
writable only by the VMs' service account and the stack's operators.
"""

from __future__ import annotations

import dataclasses
import os
import threading

import jax
from jax.experimental.compilation_cache import compilation_cache

#: Name of the cache directory inside the run directory.
CACHE_DIR_NAME = "compilation_cache"
#: Environment variable naming a cache directory shared by several runs (local path or URI).
SHARED_DIR_ENV = "MULTISLICE_COMPILATION_CACHE_DIR"

# jax.monitoring event names the cache records (jax/_src/compiler.py).
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"


@dataclasses.dataclass
class CacheStats:
    """What the cache saved this process so far.

    Attributes:
      hits: executables loaded from the cache instead of compiled (count).
      seconds_saved: compile time those hits saved, in seconds (JAX's own estimate: the
        recorded compile time minus the time the lookup took).
    """

    hits: int = 0
    seconds_saved: float = 0.0


_stats = CacheStats()
_lock = threading.Lock()
_listening = False


def _on_event(event: str, **_kwargs) -> None:
    if event == _HIT_EVENT:
        with _lock:
            _stats.hits += 1


def _on_duration(event: str, duration_secs: float, **_kwargs) -> None:
    if event == _SAVED_EVENT:
        with _lock:
            _stats.seconds_saved += max(0.0, float(duration_secs))


def cache_dir(run_dir: str) -> str:
    """The cache's location for a run directory (local path or ``gs://`` URI)."""
    return run_dir.rstrip("/") + "/" + CACHE_DIR_NAME


def enable(run_dir: str) -> str:
    """Use ``<run_dir>/compilation_cache`` (or ``$MULTISLICE_COMPILATION_CACHE_DIR``, when set)
    as JAX's persistent compilation cache.

    Call before the first compilation of the run. Calling it again with another run
    directory (tests run several in one process) moves the cache there. Every executable is
    cached, however fast it compiled (JAX's default floor is 1 s): a run has a handful, and
    a cold restart of a many-host job pays the slowest host's compile of each. The statistics
    (:func:`stats`) start from zero.

    Returns:
      The cache directory.
    """
    global _listening
    path = os.environ.get(SHARED_DIR_ENV) or cache_dir(run_dir)
    _key_cpu_devices_alike()
    compilation_cache.reset_cache()
    compilation_cache.set_cache_dir(path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    with _lock:
        _stats.hits, _stats.seconds_saved = 0, 0.0
        if not _listening:
            jax.monitoring.register_event_listener(_on_event)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _listening = True
    return path


def _key_cpu_devices_alike() -> None:
    """Make the accelerator part of JAX's cache key the same in every process of a CPU job
    (the module docstring says why); other platforms keep JAX's own. Idempotent; does
    nothing on a JAX without ``_hash_accelerator_config``."""
    from jax._src import cache_key

    original = getattr(cache_key, "_hash_accelerator_config", None)
    if original is None or getattr(original, "multislice_cpu_alike", False):
        return

    def hash_accelerator_config(hash_obj, accelerators) -> None:
        devices = list(accelerators.flat)
        if not devices or any(device.platform != "cpu" for device in devices):
            return original(hash_obj, accelerators)
        for device in devices:
            hash_obj.update(f"{device.device_kind}:{device.id}:{device.process_index};".encode())
        return None

    # A marker the getattr above reads back (idempotence).
    hash_accelerator_config.multislice_cpu_alike = True  # pyright: ignore[reportFunctionMemberAccess]
    cache_key._hash_accelerator_config = hash_accelerator_config


def stats() -> CacheStats:
    """A copy of this process's cache statistics since it started."""
    with _lock:
        return dataclasses.replace(_stats)
