"""Where a stack's local emulation keeps its state, and how a run is found and stopped.

``<state root>/<stack>/`` holds:

* ``gcs/``: the emulated Cloud Storage's backend (``infra.emulated.gcs``): the stack's bucket
  is ``gcs/<bucket>/``, and the run directory ``gs://<bucket>/runs/<run name>`` its objects
  under ``runs/<run name>/``; read them through the server, not as files;
* ``vms/slice-S-worker-W/``: each emulated VM's local disk (``MULTISLICE_HOME``); of an emulated
  GKE Pod, its container's own filesystem;
* ``nodes/slice-S-worker-W/``: of an emulated GKE Pod, its node's folder (``MULTISLICE_NODE_CACHE``,
  the JobSet's ``hostPath``), kept across the Pods of that node;
* ``logs/slice-S-worker-W.log``: each VM's console output; ``logs/fake-gcs-server.log``;
* ``lock``: held (flock) by the running emulator for its whole life;
* ``emulator.json``: the running emulator's pid, start time and process group (written as
  soon as ``local up`` holds the lock, before anything is started), its emulation id (the
  value of ``MULTISLICE_EMULATION_ID`` in the environment of every VM process and of the
  storage server), the VMs' process groups and the storage server's URL, so that
  ``multislice local down`` can stop a run whose emulator died and ``multislice local
  status`` can read a running one, and its emulated TPU API's URL (``multislice local reset``);
* ``stack-file``: the stack file a ``local up --config-file`` ran from (every command then finds
  the stack by its name too: ``infra.cli.options.load_config``);
* ``deleted.json``: the emulated queued resource was deleted by its worker 0 of slice 0 once
  the run completed (``deleteOnComplete``; ``infra.backends.queued_resource.emulated_api``): its resource name, when
  (seconds since the epoch) and the run directory. Written when the emulated TPU API accepts
  the delete, removed when ``local up`` creates the queued resource again (a new run, or more
  steps); ``multislice local status`` reports it as ``DELETED``.

A state directory that cannot be one (a file, ``/dev/null/x``) or an ``emulator.json`` this code
did not write makes :func:`read_state` raise :class:`StateError`, one line that every ``local``
command prints (``infra.cli.local``); ``local down`` removes a damaged file (:func:`discard_damaged`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from infra import invocation
from infra.emulated import supervisor
from infra.readers import state_records
from infra.readers.files import UnreadableFile, read_bounded

if TYPE_CHECKING:  # imported by the functions that need it: `local down` stays light
    pass

#: Environment variable every emulated VM process carries, with its run's emulation id: lets
#: tests and ``local down`` find processes that outlived the emulator.
EMULATION_ID_ENV = "MULTISLICE_EMULATION_ID"


@dataclasses.dataclass(frozen=True)
class LocalPaths:
    """Where a stack's emulation keeps its state (``<state root>/<stack>/``)."""

    root: Path

    @property
    def gcs_root(self) -> Path:
        return self.root / "gcs"

    @property
    def gcs_log(self) -> Path:
        return self.logs_dir / "fake-gcs-server.log"

    @property
    def state_file(self) -> Path:
        return self.root / "emulator.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def down_request(self) -> Path:
        """Written by ``multislice local down`` before its SIGTERM: the emulator then ends as
        stopped on purpose (exit 0), not as killed (``infra.local.lifecycle.ending``)."""
        return self.root / "down-requested"

    @property
    def stack_file_record(self) -> Path:
        """The absolute path of the stack file ``local up --config-file`` ran from (one line), so
        that ``--stack <name>`` finds a stack kept outside ``stacks/`` once it ran here."""
        return self.root / "stack-file"

    @property
    def deletion_file(self) -> Path:
        return self.root / "deleted.json"

    @property
    def bytecode_dir(self) -> Path:
        """The emulated VMs' Python bytecode, where this machine does not write it
        (``topology.vm_environment``)."""
        return self.root / "bytecode"

    @property
    def python3_dir(self) -> Path:
        """The emulated VMs' ``python3``, where this machine's is a shim (``topology.python3_dir``)."""
        return self.root / "bin"

    @property
    def holds_dir(self) -> Path:
        """Where a hold of ``local up --hold-at STEP`` is released: create ``<holds_dir>/<STEP>``
        (:class:`infra.local.faults.FaultGates`)."""
        return self.root / "holds"

    def vm_home(self, slice_id: int, worker: int) -> Path:
        return self.root / "vms" / f"slice-{slice_id}-worker-{worker}"

    def node_cache(self, slice_id: int, worker: int) -> Path:
        """An emulated Pod's node folder (the module docstring)."""
        return self.root / "nodes" / f"slice-{slice_id}-worker-{worker}"

    def vm_log(self, slice_id: int, worker: int) -> Path:
        return self.logs_dir / f"slice-{slice_id}-worker-{worker}.log"


#: errno values that say the disk, not the program, failed: named as such wherever they arise.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def disk_problem(err: OSError) -> str:
    """What an ``OSError`` met while writing says about the disk, in words: ``no space left
    on device``, ``disk quota exceeded``, ``read-only file system``, ``permission denied``,
    ``… is not a directory``, ``… does not exist``."""
    where = f" ({err.filename})" if err.filename else ""
    words = {
        errno.ENOSPC: "no space left on device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a component of the path is not a directory",
        errno.ENOENT: "the path cannot be created (a parent does not exist and cannot be made)",
    }
    return words.get(err.errno or 0, err.strerror or str(err)) + where


def check_writable(paths: LocalPaths) -> str | None:
    """Why the stack's state directory cannot hold a run (it is created if absent, and a
    file is written and removed there), or None."""
    probe = paths.root / f".write-test.{os.getpid()}"
    try:
        paths.root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        return disk_problem(err)
    return None


def acquire_lock(paths: LocalPaths) -> IO[str] | None:
    """Hold ``<state>/lock`` (flock) for this process's lifetime; None if another holds it.

    The kernel releases the lock when the process exits, however it exits.
    """
    import fcntl

    paths.root.mkdir(parents=True, exist_ok=True)
    handle = open(paths.root / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def write_state(
    paths: LocalPaths,
    *,
    stack: str,
    emulation_id: str,
    vms: list[dict[str, Any]],
    storage_url: str | None = None,
    tpu_api_url: str | None = None,
) -> None:
    """Record this process as the running emulator (atomically: temporary file, rename).

    Args:
      emulation_id: the value of ``MULTISLICE_EMULATION_ID`` its processes will carry.
      vms: one ``{"slice", "worker", "node", "pgid"}`` record per emulated VM (the pgid is
        also the pid of the VM's first process, its systemd).
      storage_url: the emulated Cloud Storage's URL (``http://127.0.0.1:<port>``).
      tpu_api_url: the emulated Cloud TPU API's (``infra.backends.queued_resource.emulated_api``), where ``multislice
        local reset`` sends its reset.
    """
    state = {
        "pid": os.getpid(),
        "pid_start": supervisor.start_ticks(os.getpid()),
        "pgid": os.getpgid(0),
        "stack": stack,
        "emulation_id": emulation_id,
        "vms": vms,
        "storage_url": storage_url,
        "tpu_api_url": tpu_api_url,
    }
    tmp = paths.state_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(paths.state_file)


class StateError(Exception):
    """The stack's state cannot be read: its directory cannot be one, or its ``emulator.json``
    is damaged (:class:`DamagedState`). One line: the path and what to do."""


class DamagedState(StateError):
    """``emulator.json`` is not a state :func:`write_state` wrote; ``why`` says how, in words."""

    def __init__(self, paths: LocalPaths, why: str) -> None:
        super().__init__(
            f"the local state file {paths.state_file} is damaged ({why}); remove it with "
            f"`{invocation.command('local down', paths.root.name)}` (or delete the file), then try again"
        )
        self.why = why


def state_dir_problem(root: Path) -> str | None:
    """Why ``root`` cannot be a state directory (it, or the nearest directory above it that
    exists, is not a directory: a file, ``/dev/null``), or None. Creates nothing."""
    existing = next((p for p in (root, *root.parents) if os.path.lexists(p)), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is not a directory"
    return None


def unusable_state_dir(root: Path, problem: str) -> StateError:
    """The error of a state directory that cannot be used, worded as ``local up`` words it."""
    return StateError(
        f"the local state directory {root} cannot be used: {problem}; "
        "set MULTISLICE_STATE_DIR to a writable directory with free space"
    )


def read_state(paths: LocalPaths) -> dict[str, Any] | None:
    """The recorded state, or None if there is none.

    Raises:
      StateError: the state directory cannot be read (:func:`state_dir_problem`, or the OS's
        reason), or :class:`DamagedState`: the file is not a state this code wrote.
    """
    try:
        data = read_bounded(paths.state_file, state_records.STATE_BYTES)
    except FileNotFoundError:
        return None
    except UnreadableFile as err:
        if err.kind is not None or err.too_long:  # a FIFO, a device, a huge file: not what local up writes
            raise DamagedState(paths, err.why) from None
        raise unusable_state_dir(paths.root, state_dir_problem(paths.root) or err.why) from None
    except OSError as err:
        raise unusable_state_dir(paths.root, state_dir_problem(paths.root) or disk_problem(err)) from None
    try:
        return state_records.emulator_state(data)
    except state_records.DamagedRecord as err:
        raise DamagedState(paths, err.why) from None


def discard_damaged(paths: LocalPaths, damage: DamagedState) -> str:
    """``local down`` of a stack whose ``emulator.json`` is damaged: remove the file, holding the
    lock (none holds it: no ``local up`` runs); what it did, in words.

    Raises:
      StateError: a ``local up`` holds the stack's lock.
    """
    lock = acquire_lock(paths)
    if lock is None:
        raise StateError(
            f"the local state file {paths.state_file} is damaged ({damage.why}) and a "
            f"`{invocation.command('local up')}` of "
            f"stack {paths.root.name} still holds its lock ({paths.root / 'lock'}): stop that process "
            f"(Ctrl-C where it runs), then run `{invocation.command('local down', paths.root.name)}` again"
        )
    with lock:
        forget_state(paths)
    return (
        f"removed the damaged state file {paths.state_file} ({damage.why}); a process of the run it recorded, "
        "if any is left, cannot be found through it"
    )


def forget_state(paths: LocalPaths) -> None:
    paths.state_file.unlink(missing_ok=True)


def record_deletion(paths: LocalPaths, queued_resource: str, run_dir: str) -> None:
    """Record that the emulated queued resource ``queued_resource`` (its resource name) was
    deleted now, after the run in ``run_dir`` completed (atomically: temporary file, rename)."""
    record = {"queued_resource": queued_resource, "deleted_at": round(time.time(), 3), "run_dir": run_dir}
    tmp = paths.deletion_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(paths.deletion_file)


def read_deletion(paths: LocalPaths) -> dict[str, Any] | None:
    """The deletion record (:func:`record_deletion`), or None: the emulated queued resource was
    not deleted (or the record is unreadable)."""
    return state_records.deletion_record(paths.deletion_file)


def forget_deletion(paths: LocalPaths) -> None:
    """The queued resource is created again: it is no longer deleted."""
    paths.deletion_file.unlink(missing_ok=True)


def emulator_alive(state: dict[str, Any]) -> bool:
    """True if the emulator recorded in ``state`` still runs: same pid AND same start time
    (a reused pid belongs to another process and is never signalled)."""
    return supervisor.same_process(int(state.get("pid", 0) or 0), state.get("pid_start"))


def find_processes(emulation_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this emulation id."""
    return supervisor.find_by_env(EMULATION_ID_ENV, emulation_id)


def say_in_logs(logs: Iterable[Path], line: str) -> None:
    """Append ``line`` (one line, with its newline) to each VM console log of ``logs``: what the
    emulator knows about what comes next there (``local down``, ``local reset``). Best effort: a log
    that cannot be written is left as it is."""
    for path in logs:
        try:
            with open(path, "a") as log:
                log.write(line)
        except OSError:
            continue
