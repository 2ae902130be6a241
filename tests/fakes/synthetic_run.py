"""A synthetic run directory, laid out as the trainer writes one (``training.metrics.run_log``: one
``metrics``/``events`` object per sync window, numbered in the order written across restarts;
``COMPLETE``; ``goodput.json``), uploaded in one concurrent batch to a ``gs://`` run directory of
the emulated Cloud Storage. Used by tests/status/ and tests/cli/test_status.py and benchmarks/status_time.py.

The timeline: steps 1, 2, … at ``step_time_s`` each (tokens/s = ``tokens_per_step`` ÷ step time;
step 1 includes the compile and takes 10× as long), a sync every ``log_every`` steps, a
checkpoint every ``checkpoint_every`` steps; each :class:`Fault` stops the attempt after its
step (``failure``: the unsynced window is lost, the run resumes from the last checkpoint;
``preemption``: a checkpoint is saved at that step and a ``preempted`` event written).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fault:
    kind: str  # "failure" | "preemption"
    step: int


@dataclass
class SyntheticRun:
    total_steps: int
    steps_done: int
    log_every: int = 10
    checkpoint_every: int = 100
    step_time_s: float = 0.5
    tokens_per_step: int = 1024
    faults: list[Fault] = field(default_factory=list)
    goodput: dict[str, Any] | None = None
    start_time: float = 1_700_000_000.0
    #: filled by :meth:`objects`: every record written, in order, and the events
    metrics: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def objects(self) -> dict[str, bytes]:
        """Object name (relative to the run directory) → bytes."""
        objects: dict[str, bytes] = {}
        counters = {"metrics": 0, "events": 0}
        pending = {"metrics": [], "events": []}
        now = self.start_time

        def sync() -> None:
            for name in ("metrics", "events"):
                if pending[name]:
                    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in pending[name]).encode()
                    objects[f"{name}/{counters[name]:08d}.jsonl"] = data
                    counters[name] += 1
                    pending[name] = []

        faults = sorted(self.faults, key=lambda f: f.step)
        step, last_checkpoint, restored = 0, 0, False
        while True:
            event = {"event": "start", "step": step, "restored": restored, "processes": 2, "devices": 8, "time": now}
            pending["events"].append(event)
            self.events.append(event)
            sync()
            fault = faults.pop(0) if faults and faults[0].step <= self.steps_done else None
            stop = fault.step if fault else self.steps_done
            first = True
            while step < stop:
                step += 1
                seconds = self.step_time_s * (10 if first else 1)
                now += seconds
                record = {
                    "step": step,
                    "loss": 5.0 / (1 + step / 100),
                    "grad_norm": 1.0,
                    "step_time_s": seconds,
                    "tokens_per_s": self.tokens_per_step / seconds,
                    "time": now,
                }
                if first:
                    record["includes_compile"] = True
                first = False
                pending["metrics"].append(record)
                self.metrics.append(record)
                preempted = fault is not None and fault.kind == "preemption" and step == stop
                if step % self.checkpoint_every == 0 or step == self.total_steps or preempted:
                    checkpoint = {"event": "checkpoint", "step": step, "preemption": preempted, "time": now}
                    pending["events"].append(checkpoint)
                    self.events.append(checkpoint)
                    last_checkpoint = step
                    sync()
                elif step % self.log_every == 0:
                    sync()
            if fault is None:
                break
            if fault.kind == "preemption":
                stopped = {"event": "preempted", "step": step, "time": now}
                pending["events"].append(stopped)
                self.events.append(stopped)
                sync()
            else:
                pending["metrics"], pending["events"] = [], []  # the unsynced window dies with the process
            now += 60.0  # repair and boot
            step, restored = last_checkpoint, last_checkpoint > 0
        if self.steps_done >= self.total_steps:
            done = {"event": "complete", "step": step, "loss": self.metrics[-1]["loss"], "time": now}
            pending["events"].append(done)
            self.events.append(done)
            objects["COMPLETE"] = json.dumps({"step": step, "loss": self.metrics[-1]["loss"]}).encode()
        sync()
        if self.goodput is not None:
            objects["goodput.json"] = json.dumps(self.goodput).encode()
        objects["train_config.json"] = b"{}"
        return objects


def upload(run_dir: str, objects: dict[str, bytes]) -> None:
    """Write ``objects`` under the ``gs://`` run directory ``run_dir`` (one concurrent batch,
    through the emulated Cloud Storage that ``STORAGE_EMULATOR_HOST`` names)."""
    from gcsfs.core import GCSFileSystem

    fs = GCSFileSystem(token="anon", skip_instance_cache=True)
    base = run_dir[len("gs://") :].rstrip("/")
    fs.pipe({f"{base}/{name}": data for name, data in objects.items()})
