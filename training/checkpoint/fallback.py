"""Falling back from a restored checkpoint the training cannot continue from.

The restore itself passes over checkpoints that cannot be read or fail their checks
(:mod:`training.checkpoint.restore`); this module handles what is found only by training on: a
non-finite loss or state before the first save after a restore. The first time in a run, every
process sets the restored checkpoint aside as ``<step>.nonfinite`` and the restart restores the
one before it; the second time, the training itself diverges and the run ends for good.

Either way the run records one ``restore_fallback`` event (:func:`fallback_event`, the only place
that event is built).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from training import agreement
from training.checkpoint import manager as checkpointing
from training.checkpoint.restore import Fallback
from training.metrics.run_log import RecordLog

log = logging.getLogger("training")


class RestoredStateDiverged(RuntimeError):
    """The loss went non-finite before the first save after a restore; the restored checkpoint
    was set aside, and the restart restores the one before it."""


class TrainingDiverged(RuntimeError):
    """The loss went non-finite again after the run fell back once: restarting will not help."""


def fallback_event(fallback: Fallback) -> dict[str, Any]:
    """The ``restore_fallback`` event of ``fallback``: ``step`` (the step used instead, 0 for the
    seed), ``tried`` (the step passed over), its ``path``, ``reason`` and ``time`` (Unix
    seconds). ``multislice local up`` prints these (infra/local/progress.py)."""
    return {
        "event": "restore_fallback",
        "step": fallback.used,
        "tried": fallback.tried,
        "path": fallback.path,
        "reason": fallback.reason,
        "time": time.time(),
    }


def fall_back_once(
    err: FloatingPointError,
    manager: checkpointing.CheckpointManager,
    restored_step: int,
    is_writer: bool,
    events_log: RecordLog,
) -> None:
    """A non-finite loss or state before this start's first save: the state restored from
    checkpoint ``restored_step`` leads to it (damage that passed the restore checks, e.g. finite
    garbage in a checkpoint saved before checksums were recorded, or a divergence the
    checkpoint already held). The first time in a run, every process sets that checkpoint
    aside as ``<step>.nonfinite`` (one ``restore_fallback`` event, one log line) and the
    restart restores the checkpoint before it; when the run already holds a ``*.nonfinite``
    checkpoint, the training itself diverges (a restart would loop): it ends for good.

    Raises:
      RestoredStateDiverged: the checkpoint was set aside (exit 1: restart).
      TrainingDiverged: the run already fell back once (exit 78).
    """
    where = checkpointing.describe(restored_step, checkpointing.step_path(manager, restored_step))
    # Process 0's listing, before it renames anything: every process decides alike.
    earlier = json.loads(
        agreement.all_gather("nonfinite-set-aside", json.dumps(checkpointing.set_aside_steps(manager, "nonfinite")))[0]
    )
    if earlier:
        tried = ", ".join(
            checkpointing.describe(s, checkpointing.step_path(manager, s) + ".nonfinite") for s in earlier
        )
        raise TrainingDiverged(
            f"{err} after restoring checkpoint {where}; the run already fell back from {tried} for a non-finite "
            "loss, so the training itself diverges from these checkpoints (check the learning rate, the warmup and "
            "the data); not restarting"
        ) from None
    used = max((s for s in manager.all_steps() if s < restored_step), default=0)
    fallback = Fallback(
        tried=restored_step,
        path=checkpointing.step_path(manager, restored_step),
        reason=f"{err} after restoring it",
        used=used,
    )
    events_log.append(fallback_event(fallback))
    events_log.sync()
    message = (
        f"{err} after restoring checkpoint {where}: set it aside as {restored_step}.nonfinite; the restart restores "
        f"the checkpoint before it ({'step ' + str(used) if used else 'none: the run starts again from its seed'})"
    )
    log.error("%s", message)  # before the barrier: a peer may end this process once process 0 has left
    checkpointing.set_aside([restored_step], manager, is_writer, suffix="nonfinite")
    raise RestoredStateDiverged(message) from None
