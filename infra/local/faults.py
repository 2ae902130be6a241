"""Fault injection specs for the local emulation: ``SLICE@STEP``.

* ``--preempt SLICE@STEP``: SIGTERM to every process of the slice's VMs (a maintenance event
  or spot preemption notice: the trainer may save), then SIGKILL after a grace period
  (GCE gives preempted Spot VMs 30 s: https://cloud.google.com/compute/docs/instances/spot#preemption-process).
* ``--kill SLICE@STEP``: SIGKILL to every process of the slice's VMs (a hardware fault).

The fault fires once, the first time the emulator sees (it polls the run's ``metrics`` log
every ``poll_s``; the trainer syncs it every ``log_every_steps`` and at each checkpoint) a
completed step ≥ STEP; training may be a few steps further by then, and the steps it loses
are counted from where it really was. Afterwards
the emulator repairs the queued resource the way Cloud TPU auto-repair does: the failed
slice is recreated as a whole (fresh local disks; the instances of a slice are recovered
together: https://cloud.google.com/tpu/docs/failure-recovery) and every other slice is
restarted (the job's processes cannot go on without the failed slice's).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

FaultKind = Literal["preempt", "kill"]
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


def parse_fault(kind: FaultKind, spec: str, *, slices: int, total_steps: int) -> Fault:
    """Parse ``SLICE@STEP``.

    Args:
      kind: the option (``--kill`` or ``--preempt``) the message names.
      spec: the option's value.
      slices: the stack's slice count (``multislice:slices``).
      total_steps: the run's ``training.steps``.

    Raises:
      FaultSpecError: one line naming the option and its value: wrong shape, a slice outside
        ``[0, slices)`` (with the slice count), or a step outside ``[1, total_steps)`` (a
        fault at or after the last step could never fire; with ``training.steps``).
    """
    match = _SPEC.match(spec)
    if not match:
        raise FaultSpecError(f"--{kind} {spec!r}: expected SLICE@STEP, e.g. --{kind} 1@40")
    slice_id, step = int(match.group(1)), int(match.group(2))
    if slice_id >= slices:
        which = "slice 0" if slices == 1 else f"slices 0..{slices - 1}"
        raise FaultSpecError(
            f"--{kind} {spec!r}: slice {slice_id} does not exist: the stack has {slices} "
            f"slice{'s' if slices != 1 else ''} ({which})"
        )
    if not 1 <= step < total_steps:
        raise FaultSpecError(
            f"--{kind} {spec!r}: step {step} is outside the run: training.steps is {total_steps}, so a fault "
            f"can fire at steps 1..{total_steps - 1}"
        )
    return Fault(kind, slice_id, step)
