"""One start of the trainer (:func:`training.train.run`): what it restored and saved, its logs and
timings (:class:`Start`, :func:`start_timings`), and its train step compiled once every process has
compiled it (:func:`compiled_in_step`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax

from training import agreement, membership_gate
from training.checkpoint import manager as checkpointing
from training.metrics.goodput import process_start_time
from training.metrics.run_log import RecordLog, TensorBoardLog


@dataclasses.dataclass
class Start:
    """What this start restored, and whether it has saved since (for
    :func:`training.checkpoint.fallback.fall_back_once`); its TensorBoard log, whose unsent
    window :func:`training.train.run` discards when the start ends in an error."""

    manager: checkpointing.CheckpointManager | None = None
    step: int = 0
    restored: bool = False
    saved: bool = False
    is_writer: bool = False
    events_log: RecordLog | None = None
    tensorboard: TensorBoardLog | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The elastic job's side of a change of slice count (None: not elastic).
    resizer: membership_gate.Resizer | None = None
    #: The epoch this start stopped to restart into (a change of slice count), or None.
    resized: int | None = None
    #: The slice this process's VM was allocated as (before an elastic job renumbers it): the
    #: completion marker names it, and that slice's worker 0 releases the capacity (trainer.sh).
    allocated_slice: int = 0


def start_timings(entered: float, joining: float) -> dict[str, float]:
    """The start event's ``import_s`` (process start to :func:`run`: the interpreter and its
    imports; absent without /proc) and ``join_s`` (``jax.distributed.initialize``: waiting
    for the peers), in seconds (docs/goodput.md)."""
    global _imported
    timings = {"join_s": round(time.time() - joining, 3)}
    process_start = process_start_time()
    if process_start is not None and not _imported:  # a second run in one process imported nothing
        timings["import_s"] = round(max(0.0, entered - process_start), 3)
    _imported = True
    return timings


_imported = False


def start_kind() -> dict[str, str | float]:
    """The start event's ``start_kind``: ``warm`` for an attempt the VM's standby forked,
    ``cold`` otherwise, with ``cold_reason`` when the handoff said why (``MULTISLICE_START``,
    training.standby_handoff); empty where nothing handed the attempt over (a run outside a VM)."""
    said = os.environ.get("MULTISLICE_START", "")
    if said == "warm":
        return {"start_kind": "warm"}
    if said.startswith("warm waited "):  # the attempt waited for the standby to prepare (after a boot)
        try:
            return {"start_kind": "warm", "standby_wait_s": float(said.split()[-1])}
        except ValueError:
            return {"start_kind": "warm"}
    if said.startswith("cold: "):
        return {"start_kind": "cold", "cold_reason": said[len("cold: ") :][:300]}
    return {}


def compiled_in_step(train_step: Any, state: Any, batch: jax.Array, start_step: int) -> Any:
    """The train step compiled ahead of time, once every process has compiled it.

    Only process 0 writes JAX's persistent compilation cache, so after a restart process 0
    may load the step from it while a peer compiles for tens of seconds, or never finishes:
    process 0 would wait in the first step's collectives with no bound of ours (on CPU a peer
    that compiles for 10 minutes kept it there past the test's 240 s:
    tests/training/test_agreement.py; a gloo context first used by peers more than 30 s apart
    fails instead, "Gloo context initialization failed: DEADLINE_EXCEEDED"). A
    coordination-service barrier (training.agreement, bounded by
    ``MULTISLICE_AGREEMENT_TIMEOUT_S``) after compiling lets every process reach the first step
    together, or ends them all; on TPUs it costs one round trip per start.

    Raises:
      agreement.AgreementError: a peer did not finish compiling within the bound.
    """
    compiled = train_step.lower(state, batch).compile()
    agreement.barrier(f"compiled/{start_step}")
    return compiled
