"""Preemption notices (SIGTERM): how the trainer learns of one, and a watchdog so that no
notice is ever swallowed.

A notice reaches the trainer in one of two ways:

* before ``jax.distributed`` starts (and for the whole run of a single process): this
  module's SIGTERM handler;
* once ``jax.distributed`` is up: JAX's preemption sync manager, which installs its own
  SIGTERM handler and tells every process of the job through the coordination service (key
  ``RECEIVED_PREEMPTION_NOTICE``); every process learns the step they all stop at from
  ``CheckpointManager.reached_preemption(step)``
  (https://docs.jax.dev/en/latest/_autosummary/jax.experimental.multihost_utils.reached_preemption_sync_point.html).

The training loop honours a notice at that step (:meth:`Notice.reached`): it saves and exits
75. A process blocked elsewhere — waiting for peers in initialization, restoring,
compiling, in a collective whose peer is gone — cannot, and JAX's handler only records the
notice. So a watchdog thread acts on every notice, to this process or to any process of
the job:

* before this start has trained a step (initialization, restore, the first compilation):
  nothing is lost by stopping, so the process exits ``EXIT_PREEMPTED`` (75) within
  :data:`SETTLE_S` (the pause lets every peer's watchdog see the notice too);
* later, if the loop has not begun to honour it within ``MULTISLICE_PREEMPTION_GRACE_S``
  (default :data:`DEFAULT_GRACE_S`): the process exits ``EXIT_FAILED`` (1; the steps since
  the last checkpoint are recomputed after the restart).

Either way the process ends within ``SETTLE_S + POLL_S`` or ``grace + POLL_S`` seconds of the
notice. A Spot VM gets 30 s between its preemption notice and its stop
(https://cloud.google.com/compute/docs/instances/spot#preemption-process): the default grace
leaves a loop that has not reached the next step by then to the watchdog only where the VM
stays up (maintenance, a supervisor's SIGTERM).
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

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 60.0
#: Pause before a "nothing to save" exit, so that every peer sees the notice (seconds).
SETTLE_S = 2.0
#: How often the watchdog looks for a notice to the job (seconds).
POLL_S = 1.0
#: The coordination-service key JAX's preemption sync manager sets when any process of the
#: job gets a notice (xla/tsl/distributed_runtime/preemption/preemption_sync_manager.cc).
JOB_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
EXIT_PREEMPTED, EXIT_FAILED = 75, 1


class Notice:
    """This process's view of preemption notices, and the watchdog that acts on them.

    ``install()`` from the main thread before ``jax.distributed.initialize``, and set
    ``joined`` once it returned (asking the coordination service earlier is fatal); the loop
    asks :meth:`reached` after every step; ``uninstall()`` at the end restores the previous
    SIGTERM handler.
    """

    def __init__(self, grace_s: float | None = None):
        self.grace_s = float(os.environ.get("MULTISLICE_PREEMPTION_GRACE_S", DEFAULT_GRACE_S)) if grace_s is None else grace_s
        self.local = False  # a SIGTERM reached this module's handler
        self.trained = False  # this start completed a training step
        self.honouring = False  # the loop reached the agreed step and saves
        self.joined = False  # jax.distributed is connected: the job's notices can be read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread; the loop still asks JAX
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        # The handler above runs only when the main thread runs Python; the wakeup fd is
        # written by the C-level handler at once, so the watchdog sees a notice even while
        # the main thread is blocked (https://docs.python.org/3/library/signal.html#signal.set_wakeup_fd).
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._previous_fd = signal.set_wakeup_fd(self._pipe[1])
        self._thread = threading.Thread(target=self._watch, name="preemption-watchdog", daemon=True)
        self._thread.start()

    def uninstall(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * POLL_S)
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(signal.SIGTERM, self._previous)
        for fd in self._pipe:
            os.close(fd)
        self._thread = None

    def reached(self, manager: Any, step: int) -> bool:
        """After training step ``step``: whether every process stops and saves here (the
        agreed preemption step, or a SIGTERM to this single process)."""
        self.trained = True
        hit = bool(manager.reached_preemption(step)) or self.local
        if hit:
            self.honouring = True
        return hit

    def _handle(self, signum, frame) -> None:
        del signum, frame
        self.local = True

    def _watch(self) -> None:
        noticed_at = None
        while not self._stop.is_set():
            if noticed_at is None:
                source = self._wait_for_notice()
                if source:
                    noticed_at = time.monotonic()
                    log.warning("preemption notice (%s)", source)
                continue
            if self.honouring:
                return
            waited = time.monotonic() - noticed_at
            if not self.trained and waited >= SETTLE_S:
                _exit(EXIT_PREEMPTED, "preemption notice before the first training step of this start: nothing to save; exiting")
            if waited >= self.grace_s:
                _exit(EXIT_FAILED, f"preemption notice not honoured within {self.grace_s:.0f} s (the process is blocked); exiting")
            self._stop.wait(0.2)

    def _wait_for_notice(self) -> str | None:
        readable, _, _ = select.select([self._pipe[0]], [], [], POLL_S)
        if readable and signal.SIGTERM in os.read(self._pipe[0], 512):
            return "SIGTERM to this process"
        if self.joined and _job_noticed():
            return "to a process of the job"
        return None


def _job_noticed() -> bool:
    from training import agreement

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
