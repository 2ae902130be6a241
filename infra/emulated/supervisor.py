"""Local process supervision: process groups, signals, deadlines and leftover processes.

The emulated TPU VMs (``infra.emulated.vm``) and the emulated benchmark slices
(``infra.local.bench_slices``) are both commands run as their own process group, followed
until they exit, and stopped as a whole. This module is the one place that does it:

* :meth:`ProcessGroup.start`: a command in a new session (``setsid``; its pid is the process
  group id), stdin from ``/dev/null``, stdout and stderr to a log file;
* :func:`stop_groups` (SIGTERM, grace, SIGKILL), :func:`kill_groups` (SIGKILL at once) and
  :func:`killed_on_exit` reach every process of every group (``killpg``), reap the leaders
  and wait, with a deadline, until the groups are empty;
* :func:`check_groups` / :func:`wait_groups`: all exited 0, one failed, or a deadline passed;
* :func:`die_with_parent`: a child process arms Linux ``PR_SET_PDEATHSIG`` so that it is
  SIGKILLed when its launcher dies (prctl(2), https://man7.org/linux/man-pages/man2/prctl.2.html);
* :func:`signals_raise`: SIGTERM / SIGHUP (and SIGINT) raise an exception in the main
  thread, so ``finally`` blocks stop the groups instead of the process dying at once;
* :func:`find_by_env`, :func:`start_time`, :func:`same_process`, :func:`wait_gone`,
  :func:`kill_pids`: processes that outlived their supervisor, found by an environment
  marker, and a recorded pid checked by its start time before it is signalled (a reused
  pid belongs to another process). Process inspection uses psutil
  (https://psutil.readthedocs.io/).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Self

import psutil

#: Seconds :meth:`ProcessGroup.kill` waits for the leader to be reaped and for the group to empty.
KILL_WAIT_S = 10.0
_POLL_S = 0.05


class GroupFailed(RuntimeError):
    """A supervised group's leader exited with a non-zero status."""

    def __init__(self, group: ProcessGroup, code: int) -> None:
        super().__init__(f"{group.name} exited with status {code}")
        self.group = group
        self.code = code


class DeadlineExceeded(RuntimeError):
    """The deadline passed while the named groups still ran."""

    def __init__(self, running: list[str]) -> None:
        super().__init__(f"still running: {', '.join(running)}")
        self.running = running


class ProcessGroup:
    """One command running as its own process group (see :meth:`start`).

    Attributes:
      name: what messages call it (``slice 1 worker 0``, ``slice-1``).
      log_path: where its stdout and stderr go.
      proc: the group leader.
    """

    def __init__(self, name: str, proc: subprocess.Popen, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str],
        cwd: Path | None = None,
        append: bool = False,
        header: str | None = None,
        lifeline: bool = False,
    ) -> Self:
        """Run ``argv`` in a new session with output to ``log_path``.

        Args:
          append: add to the log (else it is truncated first).
          header: a line written to the log before the command's output.
          lifeline: pass the command this process's lifeline (:mod:`infra.emulated.lifeline`):
            the command must watch it and stop when it is cut (this process died).

        Raises:
          OSError: the command or the log cannot be opened.
        """
        pass_fds: tuple[int, ...] = ()
        if lifeline:
            from infra.emulated import lifeline as lifeline_lib

            extra, pass_fds = lifeline_lib.child_settings()
            env = {**env, **extra}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab" if append else "wb") as log:
            if header is not None:
                log.write(f"{header}\n".encode())
                log.flush()
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        return cls(name, proc, log_path)

    @property
    def pgid(self) -> int:
        """The process group id (the leader's pid: it started a new session)."""
        return self.proc.pid

    def poll(self) -> int | None:
        """The leader's exit status, or None while it runs."""
        return self.proc.poll()

    def alive(self) -> bool:
        """True while any process of the group exists (children may outlive the leader)."""
        self.proc.poll()  # reap the leader if it exited, so a zombie does not count
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the group (nothing if the group is gone)."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the whole group, reap the leader and wait (up to ``KILL_WAIT_S`` each) until
        the group is empty."""
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        _wait_until(lambda: not self.alive(), time.monotonic() + KILL_WAIT_S)


def stop_groups(groups: Iterable[ProcessGroup], grace_s: float, after_signal: Callable[[], None] | None = None) -> None:
    """SIGTERM every live group, call ``after_signal`` (if any), wait up to ``grace_s`` seconds
    until all are empty, then SIGKILL whatever is left (:meth:`ProcessGroup.kill`)."""
    groups = list(groups)
    alive = [group for group in groups if group.alive()]
    for group in alive:
        group.signal(signal.SIGTERM)
    if after_signal is not None:
        after_signal()
    _wait_until(lambda: not any(group.alive() for group in alive), time.monotonic() + grace_s)
    for group in groups:
        group.kill()


def kill_groups(groups: Iterable[ProcessGroup]) -> None:
    """SIGKILL every group at once, then reap each (:meth:`ProcessGroup.kill`)."""
    groups = list(groups)
    for group in groups:
        group.signal(signal.SIGKILL)
    for group in groups:
        group.kill()


@contextlib.contextmanager
def killed_on_exit() -> Iterator[list[ProcessGroup]]:
    """A list for the groups the block starts; on leaving the block, however it is left,
    every one of them is SIGKILLed and reaped (:func:`kill_groups`)."""
    groups: list[ProcessGroup] = []
    try:
        yield groups
    finally:
        kill_groups(groups)


def check_groups(groups: Sequence[ProcessGroup]) -> bool:
    """True when every leader exited 0, False while any runs.

    Raises:
      GroupFailed: a leader exited non-zero (the first such group in ``groups``), even while
        others still run.
    """
    codes = [group.poll() for group in groups]
    for group, code in zip(groups, codes, strict=True):
        if code not in (None, 0):
            raise GroupFailed(group, code)
    return all(code == 0 for code in codes)


def wait_groups(groups: Sequence[ProcessGroup], deadline: float, poll_s: float = 0.1) -> None:
    """Wait until every leader exited 0.

    Args:
      deadline: ``time.monotonic()`` value after which to give up.

    Raises:
      GroupFailed: a leader exited non-zero.
      DeadlineExceeded: the deadline passed first (names the groups still running).
    """
    while not check_groups(groups):
        if time.monotonic() > deadline:
            raise DeadlineExceeded([group.name for group in groups if group.poll() is None])
        time.sleep(poll_s)


def die_with_parent(parent_pid: int) -> bool:
    """In a child process: be SIGKILLed when the parent dies (Linux ``PR_SET_PDEATHSIG``).

    Returns False when the parent is already not ``parent_pid`` (the launcher died before
    the signal was armed, and the child was re-parented): the caller should exit at once.
    Elsewhere than Linux the signal is not armed and only the parent check is made.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent_pid


# Processes by pid: recorded ones and leftovers --------------------------------------------


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, psutil ``create_time``), or
    None if there is no such process."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


#: A recorded start above this many seconds is a wall-clock time (:func:`start_time`, what state
#: files recorded before :func:`start_ticks`), never seconds since boot (31 years of uptime).
_EPOCH_START_THRESHOLD = 1e9
#: How far a wall-clock start may move between two reads (seconds): ``btime`` shifts when the clock is set.
_WALL_START_SLACK_S = 2.0


def start_ticks(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since boot, or None if there is no such process:
    its identity with its pid (without procfs: :func:`start_time`). ``starttime``, field 22 of
    ``/proc/PID/stat``, in clock ticks (``sysconf(_SC_CLK_TCK)``; proc_pid_stat(5)). Not
    :func:`start_time`: on Linux psutil adds ``btime`` to it, which the kernel recomputes at each
    read as the wall clock minus the uptime, truncated to seconds, so it moves by a second when NTP
    slews the clock (psutil issues #1724 and #2526); a live emulator's recorded start once stopped
    matching it, and `local exec` answered "no local run" mid-run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else start_time(pid)  # no procfs: the wall clock's
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 (state) onwards
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks


def same_process(pid: int, recorded_start: float | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``recorded_start`` (:func:`start_ticks`) is
    given, is the process that started then: a pid reused by another process gives False. A
    wall-clock ``recorded_start`` (:func:`start_time`, a state file of an older version) matches
    within :data:`_WALL_START_SLACK_S`."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if recorded_start is None:
            return True
        if recorded_start > _EPOCH_START_THRESHOLD:
            return abs(process.create_time() - recorded_start) <= _WALL_START_SLACK_S
        return start_ticks(pid) == recorded_start
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``pid`` to exit (a zombie counts as exited);
    True if it did."""

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except psutil.AccessDenied:
            return False

    return _wait_until(gone, time.monotonic() + timeout_s)


def find_by_env(key: str, value: str) -> list[int]:
    """PIDs of the live processes whose environment has ``key=value``, ascending (processes
    whose environment cannot be read are skipped)."""
    found = []
    for process in psutil.process_iter(["environ"], ad_value=None):
        environ = process.info.get("environ")
        if environ and environ.get(key) == value:
            found.append(process.pid)
    return sorted(found)


def kill_pids(pids: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to each pid; the pids that received it (gone or foreign ones are skipped)."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue
        sent.append(pid)
    return sent


def _wait_until(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``deadline`` (``time.monotonic()``) passes (False)."""
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True
