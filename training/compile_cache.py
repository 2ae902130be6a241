"""JAX's persistent compilation cache, shared by every run of a stack: a start loads the compiled
train step instead of compiling it.

Every start (a new run, a preemption, a crash, a slice recreated by auto-repair) would pay the
full XLA compile of the train step. JAX persists compiled executables and looks them up by a
key (https://docs.jax.dev/en/latest/persistent_compilation_cache.html); the directory may be a
local path or any URI etils.epath opens, ``gs://`` included.

**Where.** ``$MULTISLICE_COMPILATION_CACHE_DIR`` when set: the startup script sets it in the
trainer's unit to the stack's ``gs://<bucket>/compilation-cache`` (infra/startup/boot.sh.in), a
folder of the stack's bucket beside ``runs/``, so every run of the stack (a new ``runName``, a
run started over, a slice whose VMs got fresh disks) loads what an earlier run compiled.
Without it (the trainer run by hand) the cache is the run directory's
(``<run_dir>/compilation_cache``).

**Why sharing is safe.** An entry is found only under a key that hashes, in
jax/_src/cache_key.py ``get`` (https://github.com/jax-ml/jax/blob/jax-v0.10.2/jax/_src/cache_key.py,
read in the installed jax 0.10.2): the program (the serialized, canonicalized StableHLO module,
``_hash_computation``), the jaxlib version, the backend (platform and platform version,
``_hash_platform``), the XLA flags, the compile options (serialized: the device assignment,
replica and partition counts included), the accelerator configuration
(``_hash_accelerator_config``: the topology's fingerprint), the compression algorithm and a custom
hook. Another model, mesh, slice count, accelerator type or JAX version gives another key, so
runs of other configurations only add entries; none is ever loaded for a program it was not
compiled from. What the key cannot rule out is a damaged entry (a truncated write, a flipped
bit): every entry this module writes carries the jax/jaxlib versions and a SHA-256 of its bytes
(:class:`CheckedCache`), and an entry that fails the check, or that another JAX version wrote,
is ignored with one warning per process and compiled again (process 0 rewrites it); it is never
deserialized. A cache directory that cannot be created or written makes the run go on without
writing to it, with one warning; nothing about the cache ever stops a run.

**Every process finds process 0's entries.** In a multi-process job only process 0 writes
entries (JAX's ``_cache_write`` in jax/_src/compiler.py: "Only write cache entries from the
first process"), and the others read them: a process finds an entry only if its key equals
process 0's key. On the CPU backend (the local emulation) it never does: the accelerator
configuration (XLA's topology fingerprint of the job's devices) differs per process. Measured
on a 2-process CPU job over the same 4 devices: fingerprint 2750224376234440577 in process 0,
17646727468347767552 in process 1; the program, versions, flags and compile options hash alike
(the ``jax._src.cache_key`` logger at DEBUG prints each part's hash). :func:`enable` therefore
keys CPU devices by what identifies them in the job (kind, global id, process index; the device
assignment in the compile options already fixes their order), the same in every process,
through JAX's private ``_hash_accelerator_config`` (jax is pinned below 0.11 in pyproject.toml;
without that function the cache works as before). Other platforms keep JAX's own key: whether
TPU processes share it was not measured here (no TPU). Measured after the change: in the
2-process job run twice, process 1 loaded the entry process 0 wrote and computed the same result
(tests/training/test_compile_cache.py). ``jax_share_binary_between_hosts`` (off by default) is
not used: by jax/_src/compiler.py, the others would wait for process 0 to share an executable
that it loaded from the cache instead of compiling, and never shares.

The cache is trusted code (JAX's ``set_cache_dir`` docstring: "Do not share a compilation
cache with users you do not trust"); the stack's bucket is private, writable only by the VMs'
service account and the stack's operators.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

#: Name of the cache directory inside the run directory (without ``SHARED_DIR_ENV``).
CACHE_DIR_NAME = "compilation_cache"
#: Environment variable naming the cache shared by every run of the stack (local path or URI);
#: the startup script sets it (``infra.vm_contract.COMPILATION_CACHE_ENV``).
SHARED_DIR_ENV = "MULTISLICE_COMPILATION_CACHE_DIR"
#: First line of every entry :class:`CheckedCache` writes; the second names the JAX versions.
ENTRY_MAGIC = b"multislice-compilation-cache-entry/1\n"

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


def _on_event(event: str, **_kwargs: Any) -> None:
    if event == _HIT_EVENT:
        with _lock:
            _stats.hits += 1


def _on_duration(event: str, duration_secs: float, **_kwargs: Any) -> None:
    if event == _SAVED_EVENT:
        with _lock:
            _stats.seconds_saved += max(0.0, float(duration_secs))


def cache_dir(run_dir: str) -> str:
    """The cache's location for a run directory (local path or ``gs://`` URI)."""
    return run_dir.rstrip("/") + "/" + CACHE_DIR_NAME


def enable(run_dir: str) -> str:
    """Use ``$MULTISLICE_COMPILATION_CACHE_DIR`` (the stack's cache), or without it
    ``<run_dir>/compilation_cache``, as JAX's persistent compilation cache, its entries checked
    (:class:`CheckedCache`).

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
    _check_entries()
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

    def hash_accelerator_config(hash_obj: Any, accelerators: Any) -> None:
        devices = list(accelerators.flat)
        if not devices or any(device.platform != "cpu" for device in devices):
            return original(hash_obj, accelerators)
        for device in devices:
            hash_obj.update(f"{device.device_kind}:{device.id}:{device.process_index};".encode())
        return None

    # A marker the getattr above reads back (idempotence).
    hash_accelerator_config.multislice_cpu_alike = True  # pyright: ignore[reportFunctionMemberAccess]
    cache_key._hash_accelerator_config = hash_accelerator_config


def _versions() -> bytes:
    from jax._src.lib import version_str as jaxlib_version

    return f"jax {jax.__version__} jaxlib {jaxlib_version}\n".encode()


class CheckedCache:
    """JAX's cache of one directory (``base``: jax/_src/lru_cache.py ``LRUCache``, whose
    ``get``/``put`` take a key and bytes), each entry framed as :data:`ENTRY_MAGIC`, a line
    naming the jax and jaxlib versions, the SHA-256 of the payload (32 bytes), then the
    payload (JAX's compressed executable).

    ``get`` returns the payload only when the frame, the versions and the digest all match;
    otherwise (damaged, truncated, written by another JAX version or by JAX without this
    frame) the entry is a miss, logged once per process as a warning, and the next ``put`` of
    its key replaces it. A read that fails is a miss; a write that fails is logged once and
    ends the writes of this process (the run goes on uncached). Nothing here raises.
    """

    def __init__(self, base: Any, path: str) -> None:
        self._base, self._path, self._versions = base, path, _versions()
        self._bad: set[str] = set()
        self._warned: set[str] = set()
        self._writable = True

    def _warn_once(self, kind: str, what: str, why: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            emit(no_action(f"{what} (further such cases are not logged)", why), log.warning)

    def get(self, key: str) -> bytes | None:
        try:
            entry = self._base.get(key)
        except Exception as err:  # a read error is a miss: the program is compiled instead
            what = f"compilation cache {self._path}: cannot read an entry ({err}); compiling"
            self._warn_once("read", what, "a miss costs compile time only")
            return None
        if entry is None:
            return None
        versions_end = entry.find(b"\n", len(ENTRY_MAGIC)) + 1
        digest_end = versions_end + hashlib.sha256().digest_size
        if not entry.startswith(ENTRY_MAGIC) or versions_end == 0 or len(entry) < digest_end:
            why = "it is damaged or was not written by this trainer"
        elif entry[len(ENTRY_MAGIC) : versions_end] != self._versions:
            written = entry[len(ENTRY_MAGIC) : versions_end].decode(errors="replace").strip()
            why = f"it was written by {written}, this is {self._versions.decode().strip()}"
        elif hashlib.sha256(entry[digest_end:]).digest() != entry[versions_end:digest_end]:
            why = "its checksum does not match: it is damaged"
        else:
            return entry[digest_end:]
        self._bad.add(key)
        self._warn_once(
            "entry",
            f"compilation cache {self._path}: ignoring entry {key}: {why}; compiling it again",
            "the program is compiled again and its entry rewritten",
        )
        return None

    def put(self, key: str, value: bytes) -> None:
        if not self._writable:
            return
        entry = ENTRY_MAGIC + self._versions + hashlib.sha256(value).digest() + value
        try:
            directory = getattr(self._base, "path", None)  # LRUCache's
            if key in self._bad and directory is not None:  # its put keeps an existing entry: remove the bad one
                from jax._src import lru_cache

                (directory / f"{key}{lru_cache._CACHE_SUFFIX}").unlink(missing_ok=True)
                self._bad.discard(key)
            self._base.put(key, entry)
        except Exception as err:
            self._writable = False
            self._warn_once(
                "write",
                f"compilation cache {self._path} cannot be written ({err}); continuing without writing to it",
                "the run goes on, compiling what it cannot cache",
            )


def _check_entries() -> None:
    """Make JAX open every cache directory through :class:`CheckedCache` (idempotent), by
    wrapping jax/_src/compilation_cache.py's private ``get_file_cache`` (jax is pinned below
    0.11); a directory that cannot be opened (created) is logged once and the run goes on
    uncached. Without that function JAX's own cache is used unchecked."""
    from jax._src import compilation_cache as jax_cache

    original = getattr(jax_cache, "get_file_cache", None)
    if original is None or getattr(original, "multislice_checked", False):
        return

    def get_file_cache(path: str):
        try:
            opened = original(path)
        except Exception as err:
            warning = no_action(
                f"compilation cache {path} cannot be used ({err}); continuing without it",
                "the run goes on, compiling every program",
            )
            emit(warning, log.warning)
            return None
        if opened is None:
            return None
        base, where = opened
        return CheckedCache(base, str(where)), where  # JAX calls only get, put and _path

    get_file_cache.multislice_checked = True  # pyright: ignore[reportFunctionMemberAccess]
    jax_cache.get_file_cache = get_file_cache


def stats() -> CacheStats:
    """A copy of this process's cache statistics since it started."""
    with _lock:
        return dataclasses.replace(_stats)
