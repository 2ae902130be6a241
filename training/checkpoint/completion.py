"""The run's completion marker ``<run dir>/COMPLETE``: JSON ``{"step": N, "loss": float | null,
"slice": S}``, written by the trainer once its last step's checkpoint is finalized; ``slice`` is the
slice the writing process's VM was allocated as (absent in a marker of ``training.workload complete``
and of older releases: slice 0), whose worker 0 releases the capacity (:func:`completed_by`).

Apart from the checkpoint manager (:mod:`training.checkpoint.manager`, which re-exports these
names) because readers outside the trainer need it without jax and orbax: ``multislice local up``
and its summary read it before they start any VM, and importing orbax costs them a second or more of
CPU (docs/development.md, "Measured").
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from training.run_dir import RunDir
from training.run_objects import json_record
from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"


def read_completion(run_dir: RunDir) -> dict[str, Any] | None:
    """The completion record ``{"step": int ≥ 1, "loss": float | None}``, or None.

    A marker that is unreadable or malformed counts as absent (with a warning): the trainer
    then restores the newest checkpoint, and when that is the last step it writes a fresh
    marker at once, so a damaged marker costs nothing and never ends an unfinished run.
    """
    try:
        data = run_dir.read(COMPLETE_MARKER)  # a local FIFO or device there: UnreadableObject, a ValueError
        if data is None:
            return None
        record = json_record(data)
        step = record["step"]
        loss = record.get("loss")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step {step!r} is not a positive integer")
        if loss is not None and (
            isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)
        ):
            raise ValueError(f"loss {loss!r} is not a finite number")
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as err:
        what = f"ignoring the malformed completion marker {run_dir / COMPLETE_MARKER} ({err})"
        why = "the trainer resumes from the newest checkpoint and, if that is the last step, writes a fresh marker"
        emit(no_action(what, why), log.warning)
        return None
    return {"step": step, "loss": None if loss is None else float(loss)}


def is_complete(run_dir: RunDir, total_steps: int) -> dict[str, Any] | None:
    """The completion record if the run reached ``total_steps`` (raising ``steps`` in the
    config makes a finished run continue from its last checkpoint)."""
    record = read_completion(run_dir)
    return record if record is not None and record["step"] >= total_steps else None


def write_completion(run_dir: RunDir, record: dict[str, Any]) -> None:
    """Write the completion marker (atomically; it replaces a damaged marker)."""
    run_dir.write(COMPLETE_MARKER, json.dumps(record, sort_keys=True).encode())


def completed_by(run_dir: RunDir) -> int | None:
    """The slice whose process wrote the completion marker (0 when the marker names none), or None
    without a marker: after an elastic run its last job may not include slice 0, and the capacity is
    released by the slice that finished (``trainer.sh stopped``, ``delete-on-complete.sh``)."""
    record = read_completion(run_dir)
    if record is None:
        return None
    data = json_record(run_dir.read(COMPLETE_MARKER) or b"{}")
    writer = data.get("slice", 0) if isinstance(data, dict) else 0
    return writer if isinstance(writer, int) and not isinstance(writer, bool) and 0 <= writer < 1 << 16 else 0
