"""``local up --withhold``: a struck slice left without capacity before the platform recreates it (a
Spot slice that does not come back at once; docs/emulation.md), in one of two forms:

* ``SLICE:DURATION`` (``1:120s``, ``0:2m``): for that long, counted from the fault, whatever the run
  does meanwhile;
* ``SLICE:until-step-STEP`` (``1:until-step-80``): until the run reports STEP. Only on an elastic stack,
  where the other slices train on without the slice (docs/faults.md, "Elastic slices"); the emulated
  trainers wait after STEP until the slice is back: where the platform restarts every slice with it
  (the queued resource), that restart; else until its recreated trainers heartbeat (:func:`returned`).
  So the run cannot end before the slice is back, however fast the machine.

:class:`infra.local.repairs.Repairs` carries them out; the trainers wait at STEP through the fault gate
(:class:`infra.local.faults.FaultGates`, ``waits``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from infra.local.faults import Fault, FaultSpecError, _number, _shown, _shown_number

_WITHHOLD = re.compile(r"^\s*([0-9]+)\s*:\s*(\S+)\s*$")
_UNTIL = "until-step-"
_UNTIL_STEP = re.compile(r"^until-step-([0-9]+)$")  # ASCII digits only
_FORM = "the form is SLICE:DURATION or SLICE:until-step-STEP, e.g. --withhold 1:120s or --withhold 1:until-step-80"


@dataclasses.dataclass(frozen=True)
class Withhold:
    """How long a struck slice stays without capacity: ``seconds`` after the fault, or until the run
    reports ``until_step`` (exactly one is set)."""

    seconds: float | None = None
    until_step: int | None = None

    def __str__(self) -> str:
        if self.until_step is not None:
            return f"until the run reaches step {self.until_step}"
        return f"for {self.seconds:g} s"


def withhold_shape(spec: str) -> tuple[str, Withhold | str]:
    """The slice's digits of ``--withhold SLICE:DURATION`` or ``SLICE:until-step-STEP``, and its
    :class:`Withhold` (for the second form, the step's digits: the stack's steps check them),
    checked without the stack: what the command line checks first.

    Raises:
      FaultSpecError: ``spec`` is malformed: of neither form, a duration
        :func:`infra.durations.parse_duration` refuses, or a step that is not ASCII digits (the line says
        which, and the forms).
    """
    from infra.durations import parse_duration

    shown = _shown(spec)
    match = _WITHHOLD.fullmatch(spec)
    if not match:
        raise FaultSpecError(f"--withhold {shown} is malformed: {_FORM}")
    value = match.group(2)
    if value.startswith(_UNTIL):
        step = _UNTIL_STEP.fullmatch(value)
        if not step:
            raise FaultSpecError(f"--withhold {shown} is malformed: {_shown(value)} names no step; {_FORM}")
        return match.group(1), step.group(1)
    try:
        seconds = parse_duration(value)
    except ValueError as err:
        raise FaultSpecError(f"--withhold {shown} is malformed: {err}; {_FORM}") from None
    return match.group(1), Withhold(seconds=float(seconds))


def check_withholds(specs: list[str] | tuple[str, ...]) -> None:
    """Each ``--withhold`` is well formed (:func:`withhold_shape`) and no slice is withheld twice.

    Raises:
      FaultSpecError: the first malformed value, or the second ``--withhold`` of a slice (the line
        names the slice and both values).
    """
    first: dict[str, str] = {}
    for spec in specs:
        digits = withhold_shape(spec)[0].lstrip("0") or "0"
        if digits in first:
            raise FaultSpecError(
                f"--withhold {_shown(spec)}: slice {_shown_number(digits)} is withheld twice (also --withhold "
                f"{_shown(first[digits])}); give one --withhold per slice"
            )
        first[digits] = spec


def parse_withhold(spec: str, *, slices: int, faults: list[Fault], stack: Any = None) -> tuple[int, Withhold]:
    """Parse ``--withhold SLICE:DURATION`` or ``SLICE:until-step-STEP`` (module docstring): the first fault
    that strikes the slice leaves it without capacity until then.

    Args:
      spec: the option's value.
      slices: the stack's slice count.
      faults: the command line's ``--kill``, ``--preempt`` and ``--crash`` (a crash leaves the slice its
        capacity: only the others count).
      stack: the :class:`infra.config.StackConfig` (needed by ``until-step``: its steps and elastic settings).

    Returns:
      ``(slice, withhold)``.

    Raises:
      FaultSpecError: one line naming the option, in this order: malformed (:func:`withhold_shape`),
        a slice that does not exist, or one that no ``--kill``/``--preempt`` strikes; for ``until-step``,
        a stack that does not train on without the slice (not elastic, or not on this backend), a step
        outside the run (1 to ``training.steps``: at the last one the slice is back after the final
        checkpoint, and no change is taken after it), or one not after the first fault that strikes the slice.
    """
    shown = _shown(spec)
    digits, withhold = withhold_shape(spec)
    slice_id = _number(digits)
    if slice_id is None or slice_id >= slices:
        raise FaultSpecError(
            f"--withhold {shown}: slice {_shown_number(digits)} does not exist (slices 0..{slices - 1})"
        )
    struck = sorted((f for f in faults if f.slice_id == slice_id and f.kind != "crash"), key=lambda f: f.step)
    if not struck:
        raise FaultSpecError(
            f"--withhold {shown}: no --kill or --preempt strikes slice {slice_id}, so it never loses its capacity"
        )
    if isinstance(withhold, Withhold):
        return slice_id, withhold
    if stack is None:
        raise ValueError("an until-step withhold is checked against its stack")
    if (why := _trains_without_a_slice(stack)) is not None:
        raise FaultSpecError(
            f"--withhold {shown}: {why}, so the run reaches no step without slice {slice_id}: withhold it for a "
            f"duration instead (e.g. --withhold {slice_id}:120s)"
        )
    step, total = _number(withhold), stack.total_steps
    if step is None or not 1 <= step <= total:  # at the last step: back after the final checkpoint, no change
        raise FaultSpecError(
            f"--withhold {shown}: step {_shown_number(withhold)} is outside the run: training.steps is {total}, so "
            f"the capacity can come back at steps 1..{total}"
        )
    first = struck[0]
    if step <= first.step:
        raise FaultSpecError(
            f"--withhold {shown}: step {step} is not after --{first.kind} {slice_id}@{first.step}, the first fault "
            f"that strikes slice {slice_id}: the capacity comes back after it is lost"
        )
    return slice_id, Withhold(until_step=step)


def _trains_without_a_slice(stack: Any) -> str | None:
    """Why the stack's other slices do not train on while one is lost, or None where they do."""
    from infra.config import elastic

    minimum = stack.elastic.min_slices
    if minimum is None or minimum >= stack.slices:
        value = "unset" if minimum is None else f"{minimum}, every one of multislice:slices"
        return f"the stack is not elastic (multislice:elastic.minSlices is {value})"
    if not elastic.carried_out(stack):
        return f"elastic slices are not carried out on the {stack.backend} backend yet"
    return None


def parse_withholds(specs: list[str], *, slices: int, faults: list[Fault], stack: Any = None) -> dict[int, Withhold]:
    """Every ``--withhold`` of a command line: slice → :class:`Withhold` (:func:`parse_withhold`).

    Raises:
      FaultSpecError: as :func:`check_withholds` (a slice withheld twice), then :func:`parse_withhold`.
    """
    check_withholds(specs)
    return dict(parse_withhold(spec, slices=slices, faults=faults, stack=stack) for spec in specs)


def returned(run_dir: Any, slice_id: int, workers: int, since: float) -> bool:
    """Whether every one of the ``workers`` trainers of slice ``slice_id`` wrote a heartbeat at or after
    ``since`` (the time its capacity came back, ``time.time()``): the returned slice is up, in the
    membership gate (training/heartbeats.py)."""
    from training import heartbeats

    fresh = {b.worker for b in heartbeats.read_all(run_dir) if b.slice_id == slice_id and b.time >= since}
    return fresh >= set(range(workers))
