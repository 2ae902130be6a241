"""Checkpoints (Orbax), the checkpoint policy, and the run's completion marker.

Run directory layout (local path or ``gs://``)::

    <run_dir>/checkpoints/<step>/   Orbax checkpoints; only finalized ones are restored
    <run_dir>/train_config.json     the TrainConfig of the run's first start
    <run_dir>/metrics.jsonl         one record per step (training.run_log)
    <run_dir>/events.jsonl          start / checkpoint / preempted / complete records
    <run_dir>/COMPLETE              written once the last step's checkpoint is finalized

Orbax writes a checkpoint under a temporary name and renames it when finalized; a save
killed mid-flight leaves ``<step>.orbax-checkpoint-tmp*`` and ``latest_step()`` picks the
previous finalized step (DESIGN.md, "Orbax").

The policy (:class:`CheckpointPolicy`): save every ``interval_steps``, at the last step, and
at a preemption sync point (all hosts agree on the step: ``CheckpointManager.
reached_preemption``, backed by ``jax.distributed``'s preemption sync manager).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from training.config import TrainConfig
from training.run_log import join

log = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"


class RunConfigMismatch(ValueError):
    """The run directory belongs to a run with a different model; resuming would fail."""


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """When to save. ``step`` is the number of completed optimizer steps."""

    interval_steps: int
    total_steps: int

    def should_save(self, step: int, preempted: bool = False) -> bool:
        return preempted or step == self.total_steps or step % self.interval_steps == 0


def checkpoint_dir(run_dir: str) -> str:
    return join(run_dir, "checkpoints")


def read_completion(run_dir: str) -> dict[str, Any] | None:
    """The completion record if the run finished, else None."""
    marker = epath.Path(join(run_dir, COMPLETE_MARKER))
    if not marker.exists():
        return None
    try:
        return json.loads(marker.read_text())
    except json.JSONDecodeError:
        return {"step": None}


def write_completion(run_dir: str, record: dict[str, Any]) -> None:
    """Write the completion marker (temporary name, then rename, where the filesystem can)."""
    marker = epath.Path(join(run_dir, COMPLETE_MARKER))
    if "://" in run_dir:
        marker.write_text(json.dumps(record, sort_keys=True))
        return
    tmp = epath.Path(join(run_dir, COMPLETE_MARKER + ".tmp"))
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.rename(marker)


def check_run_config(run_dir: str, config: TrainConfig, is_writer: bool) -> None:
    """Record the run's TrainConfig at its first start; refuse a different model later.

    Changing ``steps``, the schedule, the checkpoint policy or the parallelism of an existing
    run is allowed (checkpoints are resharded on restore); changing the model, sequence
    length or data would make the checkpoints unusable or the data order different.

    Raises:
      RunConfigMismatch: names the keys that differ.
    """
    path = epath.Path(join(run_dir, "train_config.json"))
    if path.exists():
        recorded = json.loads(path.read_text())
        current = json.loads(config.model_dump_json())
        differing = [
            key for key in ("model", "sequence_length", "data", "seed") if recorded.get(key) != current.get(key)
        ]
        if differing:
            raise RunConfigMismatch(
                f"run directory {run_dir} holds a run with different training.{', training.'.join(differing)}: "
                f"recorded {', '.join(json.dumps(recorded.get(k)) for k in differing)}; "
                "use a new multislice:runName (or `multislice local up --fresh`) to start a new run"
            )
    elif is_writer:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config.model_dump_json(indent=2))


def make_manager(run_dir: str, config: TrainConfig) -> ocp.CheckpointManager:
    """An Orbax CheckpointManager over ``<run_dir>/checkpoints`` keeping ``checkpoint.keep``
    finalized steps; saves are forced by :class:`CheckpointPolicy`, not Orbax's own policy."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.checkpoint.keep,
        enable_async_checkpointing=config.checkpoint.async_save,
        create=True,
    )
    return ocp.CheckpointManager(checkpoint_dir(run_dir), options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any) -> None:
    manager.save(step, args=ocp.args.StandardSave(state), force=True)


def restore(manager: ocp.CheckpointManager, abstract_state: Any) -> tuple[int, Any] | None:
    """Restore the newest finalized checkpoint onto ``abstract_state``'s shardings.

    Returns:
      ``(step, state)``, or None when there is no finalized checkpoint.
    """
    step = manager.latest_step()
    if step is None:
        return None
    state = manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    return step, state
