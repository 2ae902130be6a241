"""Preemption notices (SIGTERM), and a watchdog so that none is swallowed.

Before ``jax.distributed`` starts (and in a single process) this module's SIGTERM handler
gets a notice; after, JAX's preemption sync manager owns SIGTERM and tells every process
(coordination-service key ``RECEIVED_PREEMPTION_NOTICE``), and the loop stops at the agreed
step (``CheckpointManager.reached_preemption``,
https://docs.jax.dev/en/latest/_autosummary/jax.experimental.multihost_utils.reached_preemption_sync_point.html).
A process blocked elsewhere (initialization, restore, compilation, a collective whose peer
is gone) cannot honour it, so a watchdog thread ends it: exit 75 within ``SETTLE_S +
POLL_S`` if this start has not trained a step (nothing to save), else exit 1 if the loop has
not begun to honour the notice within ``MULTISLICE_PREEMPTION_GRACE_S`` (default 60 s).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from training import agreement, knobs
from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 60.0
#: Pause before a "nothing to save" exit, so every peer sees the notice (s).
SETTLE_S = 2.0
POLL_S = 1.0
#: Set by JAX's preemption sync manager (xla preemption_sync_manager.cc).
JOB_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
EXIT_PREEMPTED, EXIT_FAILED = 75, 1


#: Orbax's warning at the agreed step (``orbax/checkpoint/_src/multihost/multihost.py``,
#: ``_maybe_log_reached_preemption``), logged by each of its checks of that step: ``should_save``,
#: ``save`` and the finalize thread (``orbax/checkpoint/checkpoint_manager.py``), besides this
#: module's own. Its arguments: the process index, the thread's name, the step.
ORBAX_SYNC_POINT = "[process=%s][thread=%s] Reached preemption sync point, step=%s"


class SyncPointOnce(logging.Filter):
    """Lets Orbax's :data:`ORBAX_SYNC_POINT` warning through once per process and step (the first
    thread's); every other record passes. Installed on the ``absl`` logger by :meth:`Notice.install`."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[Any, Any]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != ORBAX_SYNC_POINT or not isinstance(record.args, tuple) or len(record.args) != 3:
            return True
        key = (record.args[0], record.args[2])
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


class Notice:
    """``install()`` before ``jax.distributed.initialize``; set ``joined`` after it (asking
    the service earlier is fatal); the loop asks :meth:`reached` after every step."""

    def __init__(self, grace_s: float | None = None):
        self.grace_s = knobs.seconds("MULTISLICE_PREEMPTION_GRACE_S", DEFAULT_GRACE_S) if grace_s is None else grace_s
        self.local = False  # a SIGTERM reached this module's handler
        self.trained = False  # this start completed a training step
        self.honouring = False  # the loop reached the agreed step and saves
        self.joined = False  # jax.distributed is connected: the job's notices can be read
        #: Set once a notice reached this process or the job (the watchdog saw it): whatever waits
        #: outside the step loop (the emulation's fault gate) stops waiting.
        self.noticed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread; the loop still asks JAX
        self._once = SyncPointOnce()
        logging.getLogger("absl").addFilter(self._once)
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        # Written at once by the C-level handler, even while the main thread is blocked.
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._previous_fd = signal.set_wakeup_fd(self._pipe[1])
        self._thread = threading.Thread(target=self._watch, name="preemption-watchdog", daemon=True)
        self._thread.start()

    def uninstall(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        # Wake the watchdog from its select on the pipe (a byte that is no signal's number),
        # instead of waiting up to POLL_S for it: every exit, and so every restart, ran
        # through here after the run's last record.
        try:
            os.write(self._pipe[1], b"\0")
        except BlockingIOError:  # the pipe is full: the watchdog has bytes to read anyway
            pass
        self._thread.join(timeout=2 * POLL_S)
        logging.getLogger("absl").removeFilter(self._once)
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(signal.SIGTERM, self._previous)
        for fd in self._pipe:
            os.close(fd)
        self._thread = None

    def reached(self, manager: Any, step: int) -> bool:
        """Whether every process saves and stops after training step ``step``."""
        self.trained = True
        hit = bool(manager.reached_preemption(step)) or self.local
        if hit:
            self.honouring = True
        return hit

    def _handle(self, signum: int, frame: object) -> None:
        del signum, frame
        self.local = True
        self.noticed.set()

    def _watch(self) -> None:
        noticed_at = None
        while not self._stop.is_set():
            if noticed_at is None:
                source = self._wait_for_notice()
                if source:
                    noticed_at = time.monotonic()
                    self.noticed.set()
                    warning = no_action(
                        f"stop notice ({source}): a preemption, a maintenance event or a stop; saving at the agreed "
                        "step",
                        "the trainer's next start resumes from that checkpoint",
                    )
                    emit(warning, log.warning)
                continue
            if self.honouring:
                return
            waited = time.monotonic() - noticed_at
            # The coordinator hosts the coordination service: it leaves last, or its exit
            # would abort the peers still settling.
            if not self.trained and waited >= SETTLE_S * (2 if self.joined and _process_index() == 0 else 1):
                _exit(
                    EXIT_PREEMPTED,
                    "stop notice before the first training step of this start: nothing to save; exiting",
                )
            if waited >= self.grace_s:
                _exit(
                    EXIT_FAILED,
                    f"stop notice not honoured within {self.grace_s:.0f} s (the process is blocked); exiting",
                )
            self._stop.wait(0.2)

    def _wait_for_notice(self) -> str | None:
        readable, _, _ = select.select([self._pipe[0]], [], [], POLL_S)
        if readable and signal.SIGTERM in os.read(self._pipe[0], 512):
            return "SIGTERM to this process"
        if self.joined and _job_noticed():
            return "to a process of the job"
        return None


def _process_index() -> int:
    import jax

    return jax.process_index()


def _job_noticed() -> bool:
    client = agreement.client()
    if client is None:
        return False
    try:
        client.key_value_try_get(JOB_NOTICE_KEY)
    except Exception:  # NOT_FOUND until a notice; UNAVAILABLE once the service is gone
        return False
    return True


def _exit(code: int, message: str) -> None:
    log.error("%s %d", message, code)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
