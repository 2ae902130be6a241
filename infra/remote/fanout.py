"""Run one command per worker, all at once, and stream their output with a prefix per worker.

:func:`run_all` starts every :class:`Target`'s process at once (no batches: the Multislice
overview warns that ``gcloud compute tpus queued-resources ssh --node=all --worker=all
--batch-size=N`` deadlocks on a training command when the slices outnumber the batch, because a
batch's workers wait at the first collective for workers of a batch that never starts;
https://cloud.google.com/tpu/docs/multislice-introduction). The one exception is a target that
names another in ``after``: it starts as soon as that one prints a line holding its
``ready_marker``, ends its output, or has run :data:`GATE_TIMEOUT_S`, whichever comes first
(``multislice exec`` on Cloud TPU lets one worker per node put the SSH key on the node before
the others start; :mod:`infra.remote.gcloud`). A wait on a marker is bounded, so a collective
can only be held up, never deadlocked. One reader thread per process copies each output line to
the worker's log file as it arrives and hands it, prefixed ``[slice s worker w]``, to ``emit``;
lines of different workers interleave as they come, a line is never cut. Each process runs in a
session of its own, so Ctrl-C (or any exception) stops every one of them: SIGTERM,
:data:`STOP_GRACE_S`, SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

#: Seconds between SIGTERM and SIGKILL when the run is interrupted.
STOP_GRACE_S = 5.0
#: Seconds a target with ``after`` waits at most for the target it follows to print its
#: ``ready_marker`` (then it starts anyway, with a notice).
GATE_TIMEOUT_S = 120.0
#: Longest sleep of the waiting main thread (seconds). CPython runs a signal's handler in the
#: main thread only, and the kernel may hand a process-directed SIGINT to one of the output
#: readers' threads: a main thread asleep in an unbounded ``wait()``/``join()`` would then not
#: see Ctrl-C until every worker ended (they run in their own sessions and never get it).
WAKE_S = 0.5


@dataclass(frozen=True)
class Target:
    """One worker and the process that runs the command there.

    Args:
      slice_id, worker: the worker's place (slice index, worker index in the slice).
      argv: the local process (``gcloud … ssh …``, or a shell in an emulated VM).
      env: its environment (None: this process's).
      cwd: its working directory (None: this process's).
      after: the index, in :func:`run_all`'s targets, of the target this one starts after (that
        one has no ``after`` itself); None: it starts at once.
      ready_marker: text that, in one of this target's output lines, lets the targets that
        start ``after`` it start (None: only its end, or :data:`GATE_TIMEOUT_S`, does).
    """

    slice_id: int
    worker: int
    argv: Sequence[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    after: int | None = None
    ready_marker: str | None = None

    @property
    def name(self) -> str:
        """``slice S worker W``."""
        return f"slice {self.slice_id} worker {self.worker}"

    @property
    def prefix(self) -> str:
        """``[slice S worker W]``, the start of each of its output lines."""
        return f"[{self.name}]"

    @property
    def log_name(self) -> str:
        """``slice-S-worker-W.log``, its file in the log directory."""
        return f"slice-{self.slice_id}-worker-{self.worker}.log"


@dataclass
class Outcome:
    """How one target's process ended: its exit status (negative: killed by that signal),
    its full output's file, and seconds from the start of :func:`run_all` to its first output
    line (None: it printed nothing)."""

    target: Target
    code: int
    log_path: Path
    first_output_s: float | None = None
    lines: int = 0

    @property
    def ok(self) -> bool:
        return self.code == 0


@dataclass
class Run:
    """What :func:`run_all` returns: every outcome, in the targets' order, and the seconds the
    whole run took."""

    outcomes: list[Outcome]
    seconds: float
    log_dir: Path
    failed: list[Outcome] = field(init=False)

    def __post_init__(self) -> None:
        self.failed = [o for o in self.outcomes if not o.ok]


def new_log_dir(parent: Path) -> Path:
    """A new directory ``parent/<UTC time>`` (``20261201T170315Z``; ``-2``, ``-3``, … when
    that exists), created with its parents.

    Raises:
      OSError: it cannot be created.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free log directory name under {parent}")


def describe_code(code: int) -> str:
    """``exit 3``, or ``killed by SIGKILL`` for a negative status."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def run_all(
    targets: Sequence[Target],
    log_dir: Path,
    emit: Callable[[str], None],
    notice: Callable[[str], None] | None = None,
    gate_timeout_s: float = GATE_TIMEOUT_S,
) -> Run:
    """Start every target's process at once (a target with ``after`` once the target it follows
    is ready, see the module docstring), stream its lines to ``emit`` (prefixed, one call per
    line, never two at a time) and then to ``log_dir/<slice-S-worker-W.log>`` (unprefixed, as
    written: a line in a log has been passed to ``emit``), and wait until all exited. ``notice``
    gets one line when a target starts because ``gate_timeout_s`` passed rather than on its
    leader's marker.

    Raises:
      ValueError: an ``after`` that is not the index of an earlier target without ``after``.
      OSError: a process cannot be started (those already started are stopped first), or a
        log file cannot be written.
      KeyboardInterrupt: Ctrl-C; every process was stopped first.
    """
    followers: dict[int, list[int]] = {}
    for index, target in enumerate(targets):
        if target.after is not None:
            if not 0 <= target.after < index or targets[target.after].after is not None:
                raise ValueError(f"{target.name}: after={target.after} is not an earlier target without after")
            followers.setdefault(target.after, []).append(index)
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    readers: list[threading.Thread] = []
    ready = {leader: threading.Event() for leader in followers}
    outcomes = [Outcome(t, 0, log_dir / t.log_name) for t in targets]

    def launch(index: int) -> None:
        target = targets[index]
        proc = subprocess.Popen(
            list(target.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=target.env,
            cwd=target.cwd,
            start_new_session=True,
        )
        procs[index] = proc
        reader = threading.Thread(
            target=_copy, args=(proc, outcomes[index], emit, lock, start, ready.get(index)), daemon=True
        )
        readers.append(reader)
        reader.start()

    try:
        for index, target in enumerate(targets):
            if target.after is None:
                launch(index)
        waiting = dict(followers)
        while waiting:
            for leader in list(waiting):
                timed_out = time.monotonic() - start >= gate_timeout_s
                if ready[leader].is_set() or timed_out:
                    if not ready[leader].is_set() and notice is not None:
                        notice(
                            f"{targets[leader].name} did not report ready within {gate_timeout_s:g} s; "
                            f"starting the {len(waiting[leader])} worker(s) that wait for it anyway"
                        )
                    for index in waiting.pop(leader):
                        launch(index)
            if waiting:
                time.sleep(0.02)
        for index in range(len(targets)):
            outcomes[index].code = _wait_awake(procs[index])
        for reader in readers:
            while reader.is_alive():
                reader.join(WAKE_S)
    except BaseException:
        _stop(list(procs.values()))
        raise
    return Run(outcomes, round(time.monotonic() - start, 3), log_dir)


def _copy(
    proc: subprocess.Popen[bytes],
    outcome: Outcome,
    emit: Callable[[str], None],
    lock: threading.Lock,
    start: float,
    ready: threading.Event | None,
) -> None:
    assert proc.stdout is not None
    prefix = outcome.target.prefix
    marker = outcome.target.ready_marker
    try:
        with open(outcome.log_path, "wb") as log:
            for raw in iter(proc.stdout.readline, b""):
                if outcome.first_output_s is None:
                    outcome.first_output_s = round(time.monotonic() - start, 3)
                outcome.lines += 1
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                try:
                    if ready is not None and marker is not None and marker in line:
                        ready.set()
                    with lock:
                        emit(f"{prefix} {line}")
                finally:  # a line in the log has been shown (or its showing failed): in that order
                    log.write(raw)
                    log.flush()
    finally:
        if ready is not None:
            ready.set()
    proc.stdout.close()


def _wait_awake(proc: subprocess.Popen[bytes]) -> int:
    """``proc.wait()`` that lets Ctrl-C in within :data:`WAKE_S`: its exit code."""
    while True:
        try:
            return proc.wait(timeout=WAKE_S)
        except subprocess.TimeoutExpired:
            continue


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process's session, SIGKILL those left after :data:`STOP_GRACE_S`."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 2.0)):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
