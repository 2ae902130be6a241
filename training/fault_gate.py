"""The local emulation's fault gate: the trainer waits at the step a fault aims at until the
emulator has struck (``multislice local up --kill/--preempt SLICE@STEP``). Never on a real VM.

The emulator reads the run's progress by polling its ``metrics`` log; without the gate, training
may be several steps past STEP when the fault lands (a fast step, a loaded machine), or already
complete, so a test could not tell where its fault struck. With the gate, the emulated VMs' trainers
get two environment variables (``infra/local/faults.py`` sets them; nothing else does):

* ``MULTISLICE_FAULT_GATE``: a directory of the emulation's state, one per boot of the VMs;
* ``MULTISLICE_FAULT_STEPS``: the steps (comma-separated) of the faults still to come.

After completing one of those steps (its records written and synced, so that the emulator reads
it at once), every process of the job waits until the file ``<directory>/<step>`` exists: the
emulator creates it as it sends the fault's signal (a preemption's SIGTERM is then honoured at the
job's agreed step, as on a TPU VM). The wait is bounded (:data:`WAIT_S`): a trainer left waiting
by a gone emulator goes on with a warning (the emulator's lifeline stops its VMs anyway:
``infra.emulated.lifeline``). A step the attempt started past is not held: the emulator then strikes
at the attempt's first reported step, as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

DIR_ENV = "MULTISLICE_FAULT_GATE"
STEPS_ENV = "MULTISLICE_FAULT_STEPS"
#: Longest wait at one step, seconds: only a gone emulator leaves a gate shut this long.
WAIT_S = 600.0
#: Seconds between two looks at the gate.
POLL_S = 0.02


@dataclass(frozen=True)
class FaultGate:
    """The steps to wait at (none: the gate is off) and where the emulator opens them."""

    directory: Path | None = None
    steps: frozenset[int] = frozenset()
    wait_s: float = WAIT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultGate:
        """The gate the emulator set up (off unless both variables are set).

        Raises:
          ValueError: ``MULTISLICE_FAULT_STEPS`` is not a comma-separated list of step numbers.
        """
        env = os.environ if environ is None else environ
        directory, steps = env.get(DIR_ENV, "").strip(), env.get(STEPS_ENV, "").strip()
        if not directory or not steps:
            return cls()
        try:
            parsed = frozenset(int(step) for step in steps.split(","))
        except ValueError:
            raise ValueError(f"{STEPS_ENV}={steps!r} is not a comma-separated list of step numbers") from None
        return cls(Path(directory), parsed)

    def holds(self, step: int) -> bool:
        """Whether the trainer waits after completing ``step``."""
        return self.directory is not None and step in self.steps

    def wait(self, step: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the emulator opens the gate of ``step``, ``stop()`` is true (a preemption
        notice reached this process), or :attr:`wait_s` passed. Returns whether it was opened."""
        assert self.directory is not None
        opened = self.directory / str(step)
        log.info("fault gate: step %d done; waiting for the emulator to strike", step)
        deadline = time.monotonic() + self.wait_s
        while not opened.exists():
            if stop():
                return False
            if time.monotonic() >= deadline:
                warning = no_action(
                    f"fault gate: step {step} not opened within {self.wait_s:.0f} s; going on",
                    "training goes on without the emulator's fault (a local emulation only)",
                )
                emit(warning, log.warning)
                return False
            time.sleep(POLL_S)
        return True


def open_gate(directory: Path, step: int) -> None:
    """What the emulator does as it strikes at ``step``: let the trainers go on."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(step)).touch()
