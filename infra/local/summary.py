"""The summary of a run, computed from what the trainer wrote in its run directory.

* ``steps_completed``: highest step with a metrics record (or the completion marker's);
* ``final_loss``: training loss of that step's last record;
* ``restarts``: trainer starts after the first (``start`` events in ``events.jsonl``);
* ``steps_lost``: step records written again after a restart — work computed, lost with
  the process and recomputed from the last checkpoint;
* ``complete``: a valid completion marker for at least ``total_steps`` exists;
* ``training_seconds``: from the run's first start to its last event (all attempts, across
  every ``local up`` of the run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.checkpointing import is_complete, read_completion
from training.run_log import read_jsonl


def summarize(run_dir: Path, total_steps: int) -> dict[str, Any]:
    """Summary dict of the run in ``run_dir`` (see module docstring)."""
    metrics = read_jsonl(str(run_dir / "metrics.jsonl"))
    events = read_jsonl(str(run_dir / "events.jsonl"))
    steps = [m for m in metrics if "loss" in m]
    evals = [m for m in metrics if "eval_loss" in m]
    completion = read_completion(str(run_dir))
    steps_completed = max((int(m["step"]) for m in steps), default=0)
    if completion and completion.get("step") is not None:
        steps_completed = max(steps_completed, int(completion["step"]))
    final = [m for m in steps if int(m["step"]) == steps_completed]
    starts = [e for e in events if e.get("event") == "start"]
    times = [float(e["time"]) for e in events if "time" in e]
    return {
        "run_dir": str(run_dir),
        "complete": is_complete(str(run_dir), total_steps) is not None,
        "steps_completed": steps_completed,
        "total_steps": total_steps,
        "final_loss": float(final[-1]["loss"]) if final else None,
        "final_eval_loss": float(evals[-1]["eval_loss"]) if evals else None,
        "restarts": max(len(starts) - 1, 0),
        "steps_lost": len(steps) - len({int(m["step"]) for m in steps}),
        "training_seconds": round(max(times) - min(times), 3) if times else None,
    }
