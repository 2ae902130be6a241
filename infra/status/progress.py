"""A run's progress from its run directory, reading only the newest records.

What the trainer writes (``training.run_dir``, ``training.metrics.run_log``): ``metrics/<n>.jsonl`` and
``events/<n>.jsonl``, one object per sync window (``n`` = 00000000, 00000001, …, in the order
written, across restarts), ``COMPLETE`` (``{"step", "loss"}``, written once the last step's
checkpoint is finalized: ``training.checkpoint.completion.read_completion`` reads the same format) and,
once the trainer has accounted it, ``goodput.json`` (``{"goodput", "badput", …}``: the goodput of
every attempt so far, written at completion and at each preemption exit).

:func:`read_progress` lists the three folders (one request each, concurrently), then reads in
one concurrent batch: every ``events`` object (a few records per checkpoint and restart), the
two newest ``metrics`` objects, ``COMPLETE`` and ``goodput.json``. A 10,000-step run with a
sync every 10 steps has 1,000 metrics objects; 2 of them are read. Older metrics objects are
read (8 at a time, newest first) only while no step record has been found.

Events (``training/train.py``): ``start`` (``step``: the step resumed from, ``restored``,
``time``; ``slices`` and ``full_slices``: the job's slices and the stack's), ``checkpoint``
(``step``, ``preemption``, ``time``), ``preempted`` (``step``,
``time``: the process stopped after the preemption checkpoint), ``complete``. A restart is a
``start`` after the first, named by :func:`training.metrics.restarts.restarts_of`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.status.store import Entry, RunStore
from infra.vm_contract import COMPLETE_MARKER
from training.metrics.restarts import Restart, restarts_of
from training.metrics.run_log import parse_records
from training.run_objects import json_record

#: Metrics objects read at once (the newest first) while no step record is found.
METRICS_BATCH = 8
GOODPUT_FILE = "goodput.json"


def completion_step(data: bytes | None) -> int | None:
    """The step of a ``COMPLETE`` marker, or None when absent or malformed (as
    ``training.checkpoint.completion.read_completion`` treats it)."""
    if data is None:
        return None
    try:
        step = json_record(data)["step"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else None


def _time(record: dict[str, Any] | None) -> float | None:
    value = (record or {}).get("time")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class RunProgress:
    """Where a run stands (see :mod:`infra.status.report` for the JSON keys). Times are
    seconds since the epoch; durations seconds; None when not known yet."""

    run_dir: str
    total_steps: int
    exists: bool = False
    step: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    eta_seconds: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_at: float | None = None
    started_at: float | None = None
    updated_at: float | None = None
    training_seconds: float | None = None
    restarts: list[Restart] = field(default_factory=list)
    complete: bool = False
    completed_step: int | None = None
    completed_at: float | None = None
    goodput: float | None = None
    badput: dict[str, float] | None = None
    goodput_at: float | None = None
    #: The slices the newest start trained on, of the stack's (elastic slices: fewer while some are lost).
    slices: int | None = None
    full_slices: int | None = None

    @property
    def fraction(self) -> float:
        """Steps done ÷ total steps, in [0, 1]."""
        done = self.completed_step if self.complete else (self.step or 0)
        return min(max((done or 0) / self.total_steps, 0.0), 1.0) if self.total_steps else 0.0

    @property
    def preemptions(self) -> int:
        return sum(r.cause == "preemption" for r in self.restarts)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "restarts"}
        data["fraction"] = round(self.fraction, 6)
        data["restarts"] = len(self.restarts)
        data["preemptions"] = self.preemptions
        data["restart_history"] = [asdict(r) for r in self.restarts]
        return data


def _newest_steps(
    store: RunStore, metrics: list[Entry]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float | None]:
    """Step records of the newest metrics objects that hold one (oldest first), eval records
    among them, and the newest object's update time; reads newest first, in batches."""
    remaining = list(metrics)
    updated = metrics[-1].updated if metrics else None
    evals: list[dict[str, Any]] = []
    batch = 2
    while remaining:
        chunk, remaining = remaining[-batch:], remaining[:-batch]
        blobs = store.read([entry.name for entry in chunk])
        records = [r for entry in chunk for r in parse_records(blobs.get(entry.name, b""))]
        evals = evals or [r for r in records if "eval_loss" in r]  # the newest ones
        steps = [r for r in records if "loss" in r and "step" in r]
        if steps:
            return steps, evals, updated
        batch = METRICS_BATCH
    return [], evals, updated


def _current_attempt(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records after the last restart among ``steps`` (where the step goes back)."""
    start = 0
    for i in range(1, len(steps)):
        if int(steps[i]["step"]) <= int(steps[i - 1]["step"]):
            start = i
    return steps[start:]


def _rates(steps: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Mean step time (s) and tokens/s over ``steps``, leaving out a step that includes the
    compile unless it is the only one: tokens over time, Σ(tokens/s × s) ÷ Σ s."""
    timed = [r for r in steps if isinstance(r.get("step_time_s"), (int, float)) and r["step_time_s"] > 0]
    steady = [r for r in timed if not r.get("includes_compile")] or timed
    if not steady:
        return None, None
    seconds = sum(float(r["step_time_s"]) for r in steady)
    rated = [r for r in steady if isinstance(r.get("tokens_per_s"), (int, float))]
    tokens = sum(float(r["tokens_per_s"]) * float(r["step_time_s"]) for r in rated)
    rated_seconds = sum(float(r["step_time_s"]) for r in rated)
    return seconds / len(steady), (tokens / rated_seconds if rated_seconds else None)


def read_progress(store: RunStore, total_steps: int) -> RunProgress:
    """The progress of the run in ``store`` (see the module docstring for what is read).

    Raises:
      infra.status.store.StoreError: the run directory cannot be read.
    """
    progress = RunProgress(run_dir=str(store), total_steps=total_steps)
    listings = store.list_many(["", "metrics", "events"])
    root = {entry.name: entry for entry in listings[""]}
    metrics = [e for e in listings["metrics"] if e.name.endswith(".jsonl")]
    events_entries = [e for e in listings["events"] if e.name.endswith(".jsonl")]
    progress.exists = bool(root or metrics or events_entries)
    if not progress.exists:
        return progress
    wanted = [e.name for e in events_entries] + [name for name in (COMPLETE_MARKER, GOODPUT_FILE) if name in root]
    blobs = store.read(wanted)
    events = [r for e in events_entries for r in parse_records(blobs.get(e.name, b""))]
    steps, evals, metrics_updated = _newest_steps(store, metrics)

    starts = [e for e in events if e.get("event") == "start"]
    if steps:
        last = steps[-1]
        progress.step, progress.loss = int(last["step"]), float(last["loss"])
        attempt = _current_attempt(steps)
        begun = _time(starts[-1]) if starts else None
        if begun is not None and all(_time(r) is not None for r in attempt):
            # Only the newest attempt's steps: a restart (on fewer slices, perhaps) steps at its own speed.
            attempt = [r for r in attempt if (_time(r) or 0.0) >= begun]
        if begun is not None and not attempt:
            # The newest attempt has no step yet: the struck attempt's steps after its checkpoint are to
            # be recomputed, and its speed is not this attempt's.
            resumed = starts[-1].get("step")
            if isinstance(resumed, int) and not isinstance(resumed, bool) and resumed <= progress.step:
                progress.step = resumed
                progress.loss = next((float(r["loss"]) for r in steps if r["step"] == resumed), None)
        progress.step_time_s, progress.tokens_per_s = _rates(attempt)
    if evals:
        progress.eval_loss = float(evals[-1]["eval_loss"])
    checkpoints = [e for e in events if e.get("event") == "checkpoint" and "step" in e]
    if checkpoints:
        progress.last_checkpoint_step, progress.last_checkpoint_at = (
            int(checkpoints[-1]["step"]),
            _time(checkpoints[-1]),
        )
    progress.started_at = _time(starts[0]) if starts else None
    if starts and isinstance(starts[-1].get("slices"), int) and isinstance(starts[-1].get("full_slices"), int):
        progress.slices, progress.full_slices = int(starts[-1]["slices"]), int(starts[-1]["full_slices"])
    progress.restarts = restarts_of(events)

    completed = completion_step(blobs.get(COMPLETE_MARKER))
    progress.completed_step = completed
    progress.complete = completed is not None and completed >= total_steps
    finish = [e for e in events if e.get("event") == "complete"]
    if progress.complete and completed is not None:  # (complete: completed is not None)
        progress.completed_at = _time(finish[-1]) if finish else root[COMPLETE_MARKER].updated
        progress.step = max(progress.step or 0, completed)
    # the newest record's own time when the trainer writes one, else its object's update time
    newest = _time(steps[-1]) if steps else None
    times = [
        t for t in [newest if newest is not None else metrics_updated, *(_time(e) for e in events)] if t is not None
    ]
    progress.updated_at = max(times) if times else None
    end = progress.completed_at or progress.updated_at
    if progress.started_at is not None and end is not None:
        progress.training_seconds = round(max(end - progress.started_at, 0.0), 3)
    if progress.complete:
        progress.eta_seconds = 0.0
    elif progress.step is not None and progress.step_time_s is not None:
        progress.eta_seconds = round(max(total_steps - progress.step, 0) * progress.step_time_s, 1)

    report = _goodput(blobs.get(GOODPUT_FILE))
    if report is not None:
        progress.goodput = report.get("goodput")
        badput = report.get("badput")
        progress.badput = {str(k): float(v) for k, v in badput.items()} if isinstance(badput, dict) else None
        progress.goodput_at = root[GOODPUT_FILE].updated
    return progress


def _goodput(data: bytes | None) -> dict[str, Any] | None:
    """The goodput report, when present and readable (its ``goodput`` a number in [0, 1])."""
    if data is None:
        return None
    try:
        report = json_record(data)
    except ValueError:
        return None
    value = report.get("goodput") if isinstance(report, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        return None
    return report


def seconds_ago(moment: float | None, now: float | None = None) -> float | None:
    """Seconds from ``moment`` to ``now`` (default: the current time)."""
    return None if moment is None else max((now if now is not None else time.time()) - moment, 0.0)
