"""Which slices train together (elastic slices): an append-only record in the run directory.

``<run>/membership/<epoch>.json`` (epoch ``00000000``, ``00000001``, …) each name the slices of
the job from the step they took effect at. The newest epoch is the membership now. A change is
the next epoch, created only if it does not exist yet (:meth:`training.run_dir.RunDir.create`:
``ifGenerationMatch=0`` on Cloud Storage): of writers that each propose a change after the same
epoch (slice 0 alone, slice 1 alone: each believing the other lost) exactly one creates it, and
every other reads the winner's. So two groups of slices never both decide to train on their own
in one run directory. A record is one object written whole: it is read whole or not at all; one
that does not parse is refused, named, never taken for no record.

A record is checked, not believed (:func:`_parse`): at most :data:`MAX_RECORD_BYTES`, its epoch the
one its name says, its slices distinct ids of the run's slices, its step a count, its reason text of
at most :data:`MAX_REASON_CHARS`, its time finite and not ahead of the reader's clock by more than
:data:`MAX_CLOCK_AHEAD_S`. The gate and the summaries skip a record that fails (logged, never a
decision taken from it): :func:`current` is the newest record that passes, :func:`propose` writes past
an epoch whose record fails, :func:`history` leaves it out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from typing import Any

from training.run_dir import RunDir
from training.run_objects import UnreadableObject, json_record
from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

#: The records' folder in the run directory.
MEMBERSHIP_DIR = "membership"
#: An epoch's name: at least 8 digits (``00000001``; epoch 100000000 has 9).
_NAME = re.compile(r"^membership/(\d{8,})\.json$")
#: Largest record read (bytes): one is about 150.
MAX_RECORD_BYTES = 64 * 1024
#: Longest reason kept (characters): the gate writes under 100.
MAX_REASON_CHARS = 1000
#: How far ahead of the reader's clock a record's time may be (seconds): the VMs' clocks follow
#: Google's NTP service (training/heartbeats.py), so a record from further ahead is not one of theirs.
MAX_CLOCK_AHEAD_S = 300.0


class MembershipError(ValueError):
    """A membership record that is not one this module wrote; the message names it."""


@dataclasses.dataclass(frozen=True)
class Membership:
    """One epoch of the run's membership.

    Attributes:
      epoch: its number, from 0.
      slices: the slice ids training together, sorted.
      step: the step the job of these slices resumes from (None: from the start).
      reason: why it changed, in words (``slice 1 preempted, not back within 2m``).
      time: when it was written (seconds since the epoch).
    """

    epoch: int
    slices: tuple[int, ...]
    step: int | None
    reason: str
    time: float

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self) | {"slices": list(self.slices)}, sort_keys=True) + "\n").encode()


def _name(epoch: int) -> str:
    return f"{MEMBERSHIP_DIR}/{epoch:08d}.json"


def _count(value: Any, what: str, high: int) -> int:
    """``value`` if it is an integer (not a boolean) in ``[0, high)``; else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < high:
        raise ValueError(f"{what} {str(value)[:40]} is not an integer in [0, {high})")
    return value


def _parse(name: str, data: bytes, num_slices: int | None = None, now: float | None = None) -> Membership:
    """The record ``name`` holds, checked (the module docstring); ``num_slices``: the run's slice count.

    Raises:
      MembershipError: it is not one this module wrote, naming it and why.
    """
    try:
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"{len(data):,} bytes, over {MAX_RECORD_BYTES:,}")
        record: Any = json_record(data)
        slices = record["slices"]
        if not isinstance(slices, list) or not slices:
            raise ValueError("slices is not a list of slice ids")
        high = num_slices if num_slices is not None else 1 << 16
        ids = tuple(sorted(_count(s, "slice", high) for s in slices))
        if len(set(ids)) != len(ids):
            raise ValueError(f"slices {list(ids)} repeat an id")
        reason, when = record["reason"], record["time"]
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise ValueError(f"reason is not text of at most {MAX_REASON_CHARS} characters")
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when < 0:
            raise ValueError(f"time {str(when)[:40]} is not a time")
        if when > (time.time() if now is None else now) + MAX_CLOCK_AHEAD_S:
            raise ValueError(f"time {when} is ahead of this clock by more than {MAX_CLOCK_AHEAD_S:g} s")
        membership = Membership(
            epoch=_count(record["epoch"], "epoch", 1 << 62),
            slices=ids,
            step=None if record["step"] is None else _count(record["step"], "step", 1 << 62),
            reason=reason,
            time=float(when),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise MembershipError(f"membership record {name} is not one this trainer wrote ({err})") from None
    if _name(membership.epoch) != name:
        raise MembershipError(
            f"membership record {name} is not one this trainer wrote (it names epoch {membership.epoch})"
        )
    return membership


def read(run_dir: RunDir, epoch: int, num_slices: int | None = None) -> Membership | None:
    """Epoch ``epoch``'s record, or None if it does not exist (``num_slices``: the run's, to check it).

    Raises:
      MembershipError: it exists and does not pass :func:`_parse`.
    """
    try:
        data = run_dir.read(_name(epoch))
    except UnreadableObject as err:  # a local FIFO or device there
        raise MembershipError(f"membership record {_name(epoch)} is not one this trainer wrote ({err})") from None
    return None if data is None else _parse(_name(epoch), data, num_slices)


def _epochs(run_dir: RunDir) -> list[int]:
    return sorted(int(m[1]) for name in run_dir.list(f"{MEMBERSHIP_DIR}/*.json") if (m := _NAME.fullmatch(name)))


def _valid(run_dir: RunDir, epoch: int, num_slices: int | None) -> Membership | None:
    """Epoch ``epoch``'s record, or None when it is missing or fails :func:`_parse` (logged)."""
    try:
        return read(run_dir, epoch, num_slices)
    except MembershipError as err:
        emit(no_action(f"{err}; left out", "the newest valid record decides the slices"), log.warning)
        return None


def current(run_dir: RunDir, num_slices: int | None = None) -> Membership | None:
    """The newest epoch's record that passes :func:`_parse` (a fresh listing; one that fails is logged
    and skipped), or None before the first."""
    for epoch in reversed(_epochs(run_dir)):
        if (record := _valid(run_dir, epoch, num_slices)) is not None:
            return record
    return None


def propose(
    run_dir: RunDir, after: Membership | None, slices: tuple[int, ...], *, step: int | None, reason: str, now: float
) -> tuple[Membership, bool]:
    """Make ``slices`` the membership of the epoch after ``after`` (epoch 0 if None), if no other
    writer made that epoch first: ``(the epoch's membership, whether it is this call's)``.

    Raises:
      OSError: the write failed.
    """
    epoch = 0 if after is None else after.epoch + 1
    while True:
        mine = Membership(epoch, tuple(sorted(slices)), step, reason, now)
        if run_dir.create(_name(epoch), mine.to_json()):
            return mine, True
        theirs = _valid(run_dir, epoch, None)
        if theirs is not None:  # created by another writer, never removed
            return theirs, False
        epoch += 1  # a record that fails the checks holds this epoch: every writer goes past it alike


def history(run_dir: RunDir) -> list[Membership]:
    """Every epoch's record that passes :func:`_parse`, oldest first (a fresh listing; one that fails
    is logged and left out)."""
    return [record for epoch in _epochs(run_dir) if (record := _valid(run_dir, epoch, None)) is not None]


def describe_change(before: Membership, after: Membership, step: int | None) -> str:
    """One change of slice count: ``slices 2 → 1 at step 50 (slice 1 lost, not back within 2m)``
    (``step``: where the job of ``after`` resumed, or None: not shown)."""
    at = "" if step is None else f" at step {step}"
    return f"slices {len(before.slices)} → {len(after.slices)}{at} ({after.reason})"


def landing_steps(events: list[dict[str, Any]]) -> dict[int, int] | None:
    """Epoch → the step its job took over at, from a run's events (training/train.py): the ``preempted``
    event of a running job that stopped for it (its ``membership_epoch``), else the ``start`` of the
    epoch's first job (the step it resumed from). None when no event names an epoch (a run that is not
    elastic, or events written before they did): the records' own steps are all there is."""
    landed: dict[int, int] = {}
    named = False
    for kind in ("preempted", "start"):  # a job's stop for a change precedes the new job's start
        for event in events:
            epoch, step = event.get("membership_epoch"), event.get("step")
            if event.get("event") != kind or isinstance(epoch, bool) or not isinstance(epoch, int):
                continue
            named = True
            if isinstance(step, int) and not isinstance(step, bool):
                landed.setdefault(epoch, step)
    return landed if named else None


def describe_changes(records: list[Membership], landed: dict[int, int] | None = None) -> list[str]:
    """Each change of slice count, as the run's summary prints it (:func:`describe_change`).

    Args:
      records: the run's records, oldest first (:func:`history`).
      landed: epoch → the step the change took effect at (:func:`landing_steps`), or None where the
        run's events are not known: each record's own step is shown then (the newest checkpoint when
        the change was decided, which a running job may train past before it stops for it). With it,
        a change whose epoch never trained is shown as decided and not carried out (the run ended
        first, or a newer change took its place).
    """
    lines = []
    for before, after in zip(records, records[1:], strict=False):
        if landed is None:
            lines.append(describe_change(before, after, after.step))
        elif after.epoch in landed:
            lines.append(describe_change(before, after, landed[after.epoch]))
        else:
            decided = "" if after.step is None else f" after step {after.step}"
            lines.append(
                f"slices {len(before.slices)} → {len(after.slices)} decided{decided}, not carried out ({after.reason})"
            )
    return lines
