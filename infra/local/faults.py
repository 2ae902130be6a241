"""Fault injection specs for the local emulation: ``SLICE@STEP``.

* ``--preempt SLICE@STEP``: SIGTERM to every process of the slice's VMs (a maintenance event
  or spot preemption notice: the trainer may save), then SIGKILL after a grace period
  (GCE gives preempted Spot VMs 30 s: https://cloud.google.com/compute/docs/instances/spot#preemption-process).
* ``--kill SLICE@STEP``: SIGKILL to every process of the slice's VMs (a hardware fault).
* ``--crash SLICE@STEP``: SIGKILL to the trainer processes of the slice's VMs only (an application
  failure: an OOM kill, a crash of the runtime, a bug). The VMs stay up and nothing is repaired: each
  trainer unit restarts its trainer (``Restart=on-failure``; from the VM's warm standby), and the other
  slices' trainers end on the lost peer and are restarted by their units (docs/faults.md,
  "An application failure: the VMs stay up").

The fault fires once, the first time the emulator sees (it polls the run's ``metrics`` log
every ``poll_s``; the trainer syncs it every ``log_every_steps`` and at each checkpoint) a
completed step ≥ STEP *of the current attempt* (:class:`FaultSchedule`): steps reported
before a repair never count, so a second fault waits until the repaired run has started and
reached its step. The bundled trainer waits at STEP until the fault strikes
(:class:`FaultGates`, :mod:`training.fault_gate`), so the fault lands at STEP on any machine
and the run cannot end first; a stack's own command is not held, and may be a few steps
further by then (the steps it loses are counted from where it really was). Afterwards
the emulator repairs (all but ``--crash``) the queued resource the way Cloud TPU auto-repair does: the failed
slice is recreated as a whole (fresh local disks; the instances of a slice are recovered
together: https://cloud.google.com/tpu/docs/failure-recovery) and every other slice is
restarted (the job's processes cannot go on without the failed slice's).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from training import fault_gate

FaultKind = Literal["preempt", "kill", "crash"]
_SPEC = re.compile(r"^\s*([0-9]+)\s*@\s*([0-9]+)\s*$")  # ASCII digits only


class FaultSpecError(ValueError):
    """A malformed or impossible fault spec; the message names the option."""


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: FaultKind
    slice_id: int
    step: int

    def __str__(self) -> str:
        return f"{self.kind} slice {self.slice_id} at step {self.step}"


def fault_shape(kind: FaultKind, spec: str) -> tuple[str, str]:
    """The slice's and the step's digits of ``SLICE@STEP`` (ASCII digits, spaces around them
    allowed), checked without the stack: what the command line checks first.

    Raises:
      FaultSpecError: ``spec`` is malformed; the line names the option, the value and the form.
    """
    match = _SPEC.fullmatch(spec)
    if not match:
        raise FaultSpecError(f"--{kind} {_shown(spec)} is malformed: the form is SLICE@STEP, e.g. --{kind} 1@40")
    return match.group(1), match.group(2)


def parse_fault(kind: FaultKind, spec: str, *, slices: int, total_steps: int) -> Fault:
    """Parse ``SLICE@STEP``.

    Args:
      kind: the option (``--kill``, ``--preempt`` or ``--crash``) the message names.
      spec: the option's value.
      slices: the stack's slice count (``multislice:slices``).
      total_steps: the run's ``training.steps``.

    Raises:
      FaultSpecError: one line naming the option and its value: malformed (:func:`fault_shape`), a
        slice outside ``[0, slices)`` (with the slice count), or a step outside ``[1, total_steps)``
        (a fault at or after the last step could never fire; with ``training.steps``).
    """
    shown = _shown(spec)
    slice_digits, step_digits = fault_shape(kind, spec)
    slice_id, step = _number(slice_digits), _number(step_digits)
    if slice_id is None or slice_id >= slices:
        which = "slice 0" if slices == 1 else f"slices 0..{slices - 1}"
        raise FaultSpecError(
            f"--{kind} {shown}: slice {_shown_number(slice_digits)} does not exist: the stack has {slices} "
            f"slice{'s' if slices != 1 else ''} ({which})"
        )
    if step is None or not 1 <= step < total_steps:
        raise FaultSpecError(
            f"--{kind} {shown}: step {_shown_number(step_digits)} is outside the run: training.steps is "
            f"{total_steps}, so a fault can fire at steps 1..{total_steps - 1}"
        )
    return Fault(kind, slice_id, step)


#: The most digits (leading zeros aside) a slice or step is read with: more is past any stack's
#: slices and steps, and Python's ``int()`` refuses strings over 4,300 digits with its own error.
_MAX_DIGITS = 18


def _number(digits: str) -> int | None:
    """The value of ASCII ``digits``, or None when it has more than :data:`_MAX_DIGITS` digits."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else None


def _shown_number(digits: str) -> str:
    digits = digits.lstrip("0") or "0"
    return digits if len(digits) <= _MAX_DIGITS else f"{digits[:8]}… ({len(digits):,} digits)"


def _shown(spec: str) -> str:
    """The option's value as a message quotes it: its repr, cut short past 40 characters."""
    return repr(spec) if len(spec) <= 40 else f"{spec[:20]!r}… ({len(spec):,} characters)"


class FaultSchedule:
    """When each requested fault fires, decided from the trainer's records alone.

    A fault ``SLICE@STEP`` fires once the *current attempt* of the run (the trainer processes
    started by the latest boot) has reported a completed step ≥ STEP. Records of an earlier
    attempt never count: a fault that fires disarms the schedule until the events log shows
    the next trainer ``start`` (``training.train`` writes one per start,
    with the step it resumed from, before its first step), and only training records read
    after that start advance :attr:`attempt_step`. So two faults a step apart, or the same
    fault given twice, cause two repairs and two trainer restarts: the second waits for the
    repaired run to reach its step again (or, when the run resumed past it, for the repaired
    run's first reported step).

    Faults fire one per attempt, in step order (ties in the order given). Feed it with
    :meth:`observe` (new ``events`` records first, then new ``metrics`` records); ask
    :meth:`due`. Records the struck attempt wrote before it died must not be fed after a
    fault (the emulator reads them before the reboot and drops them): only a ``start``
    tells one attempt from the next.

    Args:
      faults: the requested faults.
      run_step: the newest step the run had reported before this emulation started (0 for
        a new run); faults at or below it are :attr:`skipped` (the run is already past them).
    """

    def __init__(self, faults: list[Fault], run_step: int = 0) -> None:
        ordered = sorted(faults, key=lambda f: f.step)
        self.skipped = [f for f in ordered if f.step <= run_step]
        self.pending = [f for f in ordered if f.step > run_step]
        #: Newest step the current attempt has reported; None until the attempt's ``start``.
        self.attempt_step: int | None = None

    def observe(self, events: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> None:
        """Take new records: ``events`` (a ``start`` arms the schedule for a new attempt,
        from the step it resumed at) then ``metrics`` (training records, those with a
        ``loss``, advance :attr:`attempt_step` while armed)."""
        for event in events:
            if event.get("event") == "start":
                self.attempt_step = int(event.get("step") or 0)
        if self.attempt_step is None:
            return
        for record in metrics:
            if "loss" in record:
                self.attempt_step = max(self.attempt_step, int(record["step"]))

    def due(self) -> Fault | None:
        """The fault to fire now (removed from :attr:`pending`; the schedule then waits for
        the next attempt's ``start``), or None."""
        if self.pending and self.attempt_step is not None and self.attempt_step >= self.pending[0].step:
            self.attempt_step = None
            return self.pending.pop(0)
        return None

    def struck_nothing(self, step: int) -> None:
        """The fault :meth:`due` returned struck nothing (its slice had no VM: ``--withhold``): no
        attempt ended, so the schedule stays armed at the attempt's ``step``."""
        self.attempt_step = step


class FaultGates:
    """Where the emulated trainers wait (:mod:`training.fault_gate`): at the steps of the faults
    still to strike, until struck, at the steps ``local up --hold-at`` names, until released, and at
    the step of a ``--withhold SLICE:until-step-STEP`` (:mod:`infra.local.withholds`), until the
    withheld slice is back and up (:meth:`let_go`).
    One gate directory per boot of the VMs under ``root`` (a repaired run's trainers wait afresh
    at a step struck twice).

    Use: :meth:`follow` the run's schedule; :meth:`boot` for each boot's environment;
    :meth:`strike` as a fault's signal is sent; :meth:`open_up_to` the current attempt's newest
    step whenever no fault is due (none strikes at those steps in this attempt; a hold opens only
    once released, a withhold's step only at :meth:`let_go`).

    A hold is released by creating the file ``<holds_dir>/<step>`` (what a test or a script does
    once it has acted on the held run: ``local reset``, a new release, ``local exec``); every
    later boot's trainers then go on past that step.

    Args:
      root: the emulation's directory for the gates (emptied by :meth:`follow`).
      holds_dir: where holds are released (emptied by :meth:`follow`).
      bundled_trainer: whether the VMs run the bundled trainer (a stack's own command knows no gate).
    """

    def __init__(self, root: Path, *, holds_dir: Path | None = None, bundled_trainer: bool = True) -> None:
        self.root = root
        self.holds_dir = holds_dir if holds_dir is not None else root.parent / "holds"
        self.bundled_trainer = bundled_trainer
        self.schedule: FaultSchedule | None = None
        self.holds: set[int] = set()
        #: The steps of ``until-step`` withholds whose slice is not back yet.
        self.waits: set[int] = set()
        self.boots = 0
        self.steps: list[int] = []

    @property
    def directory(self) -> Path:
        """The current boot's gate directory."""
        return self.root / str(self.boots)

    def follow(
        self, schedule: FaultSchedule, holds: list[int] | tuple[int, ...] = (), waits: list[int] | tuple[int, ...] = ()
    ) -> None:
        """Hold the trainers at ``schedule``'s pending faults, at ``holds`` until released, and at
        ``waits`` until let go, from the next boot on."""
        self.schedule = schedule
        self.holds = set(holds)
        self.waits = set(waits)
        shutil.rmtree(self.root, ignore_errors=True)  # an earlier `local up`'s
        shutil.rmtree(self.holds_dir, ignore_errors=True)
        if self.holds:
            self.holds_dir.mkdir(parents=True, exist_ok=True)

    def released(self, step: int) -> bool:
        """Whether the hold at ``step`` was released (its file exists)."""
        return (self.holds_dir / str(step)).exists()

    def boot(self) -> dict[str, str]:
        """A new boot: the environment variables of its gate (none when nothing is held)."""
        self.boots += 1
        if not self.bundled_trainer:
            self.steps = []
            return {}
        pending = self.schedule.pending if self.schedule is not None else []
        self.holds = {step for step in self.holds if not self.released(step)}
        self.steps = sorted({fault.step for fault in pending} | self.holds | self.waits)
        if not self.steps:
            return {}
        return {fault_gate.DIR_ENV: str(self.directory), fault_gate.STEPS_ENV: ",".join(map(str, self.steps))}

    def beside(self) -> dict[str, str]:
        """The environment of the current boot's gate, for workers booted beside running ones (a slice
        recreated while the others train): they wait at the same gates, opened in the same directory."""
        if not self.steps:
            return {}
        return {fault_gate.DIR_ENV: str(self.directory), fault_gate.STEPS_ENV: ",".join(map(str, self.steps))}

    def strike(self, step: int) -> None:
        """The fault aimed at ``step`` sends its signal: open the gate its trainers wait at."""
        fault_gate.open_gate(self.directory, step)

    def let_go(self, step: int, *, open_now: bool = True) -> None:
        """The withheld slice of the ``until-step`` withhold at ``step`` is back: no later boot waits
        there, and (``open_now``) the current boot's trainers go on."""
        self.waits.discard(step)
        if open_now:
            fault_gate.open_gate(self.directory, step)

    def open_up_to(self, step: int | None) -> None:
        """Open every gate of the current boot at or below ``step`` (None: nothing reported yet)
        but a hold or a withhold's step, and every released hold."""
        for held in self.steps:
            if held in self.waits:
                continue
            if held in self.holds:
                if self.released(held):
                    fault_gate.open_gate(self.directory, held)
            elif step is not None and held <= step:
                fault_gate.open_gate(self.directory, held)
