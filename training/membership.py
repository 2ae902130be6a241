"""Which slices train together (elastic slices): an append-only record in the run directory.

``<run>/membership/<epoch>.json`` (epoch ``00000000``, ``00000001``, …) each name the slices of
the job from the step they took effect at. The newest epoch is the membership now. A change is
the next epoch, created only if it does not exist yet (:meth:`training.run_dir.RunDir.create`:
``ifGenerationMatch=0`` on Cloud Storage): of writers that each propose a change after the same
epoch (slice 0 alone, slice 1 alone: each believing the other lost) exactly one creates it, and
every other reads the winner's. So two groups of slices never both decide to train on their own
in one run directory. A record is one object written whole: it is read whole or not at all; one
that does not parse is refused, named, never taken for no record.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from training.run_dir import RunDir
from training.run_objects import json_record

#: The records' folder in the run directory.
MEMBERSHIP_DIR = "membership"
_NAME = re.compile(r"^membership/(\d{8})\.json$")


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


def _parse(name: str, data: bytes) -> Membership:
    try:
        record: Any = json_record(data)
        membership = Membership(
            epoch=int(record["epoch"]),
            slices=tuple(sorted(int(s) for s in record["slices"])),
            step=None if record["step"] is None else int(record["step"]),
            reason=str(record["reason"]),
            time=float(record["time"]),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise MembershipError(f"membership record {name} is not one this trainer wrote ({err!r})") from None
    if _name(membership.epoch) != name or not membership.slices or min(membership.slices) < 0:
        raise MembershipError(f"membership record {name} names epoch {membership.epoch} or no slices")
    return membership


def read(run_dir: RunDir, epoch: int) -> Membership | None:
    """Epoch ``epoch``'s record, or None if it does not exist.

    Raises:
      MembershipError: it exists and does not parse.
    """
    data = run_dir.read(_name(epoch))
    return None if data is None else _parse(_name(epoch), data)


def current(run_dir: RunDir) -> Membership | None:
    """The newest epoch's record (a fresh listing), or None before the first.

    Raises:
      MembershipError: the newest record does not parse.
    """
    epochs = [int(m[1]) for name in run_dir.list(f"{MEMBERSHIP_DIR}/*.json") if (m := _NAME.fullmatch(name))]
    return None if not epochs else read(run_dir, max(epochs))


def propose(
    run_dir: RunDir, after: Membership | None, slices: tuple[int, ...], *, step: int | None, reason: str, now: float
) -> tuple[Membership, bool]:
    """Make ``slices`` the membership of the epoch after ``after`` (epoch 0 if None), if no other
    writer made that epoch first: ``(the epoch's membership, whether it is this call's)``.

    Raises:
      MembershipError: the epoch exists and its record does not parse.
      OSError: the write failed.
    """
    epoch = 0 if after is None else after.epoch + 1
    mine = Membership(epoch, tuple(sorted(slices)), step, reason, now)
    if run_dir.create(_name(epoch), mine.to_json()):
        return mine, True
    theirs = read(run_dir, epoch)
    assert theirs is not None  # it was there: created by another writer, never removed
    return theirs, False


def history(run_dir: RunDir) -> list[Membership]:
    """Every epoch's record, oldest first (a fresh listing).

    Raises:
      MembershipError: a record does not parse.
    """
    names = sorted(name for name in run_dir.list(f"{MEMBERSHIP_DIR}/*.json") if _NAME.fullmatch(name))
    records = [_parse(name, data) for name in names if (data := run_dir.read(name)) is not None]
    return records


def describe_changes(records: list[Membership], resized_at: dict[int, int] | None = None) -> list[str]:
    """Each change of slice count, as the run's summary and ``status`` print it:
    ``slices 2 → 1 at step 50 (slice 1 lost, not back within 2m)``.

    Args:
      records: the run's records, oldest first (:func:`history`).
      resized_at: epoch → the step a running job stopped at to change into it (its ``preempted``
        event's ``membership_epoch``: training/train.py), where that is known; else the record's step
        (the newest checkpoint when the change was proposed).
    """
    lines = []
    for before, after in zip(records, records[1:], strict=False):
        step = (resized_at or {}).get(after.epoch, after.step)
        at = "" if step is None else f" at step {step}"
        lines.append(f"slices {len(before.slices)} → {len(after.slices)}{at} ({after.reason})")
    return lines
