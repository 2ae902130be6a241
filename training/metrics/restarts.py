"""A run's restarts and their causes, from its ``events`` records.

Events (``training/train.py``): ``start`` (``step``: the step resumed from, ``restored``,
``time``), ``checkpoint`` (``step``, ``preemption``, ``time``), ``preempted`` (``step``,
``time``: the process stopped after the preemption checkpoint), ``complete``. A restart is a
``start`` after the first; it follows a preemption when a ``preempted`` event (or a checkpoint
saved for a preemption) lies between it and the previous ``start`` (a ``resize`` when that
``preempted`` event names a ``membership_epoch``: an elastic run stopped to change its slice count,
training/membership_gate.py; or when the ``start`` trains on another slice count than the previous
one, its ``slices``: an elastic run that a stop notice ended and that restarted on fewer slices, or on
more when the platform's restart brought a lost slice back), else a failure (a process
or a VM died: the emulator's ``--kill``, a Cloud TPU maintenance event without notice, a trainer
that ended with an error). ``multislice status`` and the emulation's summary both name restarts
this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Restart:
    """One restart of the trainer: ``cause`` ``"preemption"``, ``"resize"`` or ``"failure"``; the preempted
    step and when the preempted process stopped (None for a failure); the step the run resumed
    from (its checkpoint, when ``restored``) and when (seconds since the epoch)."""

    cause: str
    resumed_step: int
    resumed_at: float | None
    restored: bool
    preempted_step: int | None = None
    preempted_at: float | None = None
    #: A resize the run decided itself: its ``preempted`` event names a ``membership_epoch`` (an elastic
    #: run that stopped at a checkpoint to change its slice count), not a stop notice from outside.
    own_resize: bool = False


def restarts_of(events: list[dict[str, Any]]) -> list[Restart]:
    """The restarts recorded in ``events`` (in the order written), each with its cause (see
    the module docstring)."""
    restarts: list[Restart] = []
    seen_start = False
    notice: dict[str, Any] | None = None
    slices: Any = None  # the previous start's slice count (elastic slices), when it recorded one
    for event in events:
        kind = event.get("event")
        if kind == "preempted" or (kind == "checkpoint" and event.get("preemption")):
            if notice is None or kind == "preempted":
                notice = event
        elif kind == "start":
            if seen_start:
                restarts.append(
                    Restart(
                        cause=(
                            "failure"
                            if notice is None
                            else "resize"
                            if notice.get("membership_epoch") is not None or _resized(slices, event.get("slices"))
                            else "preemption"
                        ),
                        resumed_step=int(event.get("step", 0)),
                        resumed_at=_time(event),
                        restored=bool(event.get("restored")),
                        preempted_step=int(notice["step"]) if notice is not None and "step" in notice else None,
                        preempted_at=_time(notice) if notice is not None else None,
                        own_resize=notice is not None and notice.get("membership_epoch") is not None,
                    )
                )
            seen_start = True
            notice = None
            slices = event.get("slices")
    return restarts


def _resized(before: Any, after: Any) -> bool:
    """Whether two starts' ``slices`` are both counts and differ."""
    counts = [n for n in (before, after) if isinstance(n, int) and not isinstance(n, bool)]
    return len(counts) == 2 and before != after


def _time(record: dict[str, Any] | None) -> float | None:
    value = (record or {}).get("time")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
