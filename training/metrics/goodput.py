"""Goodput of a run: productive step time ÷ wall time, and badput seconds by cause.

From the ``events`` and ``metrics`` records of every attempt (training.metrics.run_log); wall time
runs from the first process start to the ``complete`` event. Causes and how each is
measured: docs/goodput.md. Not ml-goodput-measurement (https://pypi.org/project/
ml-goodput-measurement/): it records to and reads from Google Cloud Logging only, needs
google-cloud-logging, -storage and scipy on every VM, and takes other records only through a
constructor argument documented as "should never be passed directly by the user".
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

CAUSES = (
    "initialization",
    "compilation",
    "checkpoint_save",
    "checkpoint_restore",
    "evaluation",
    "recomputed_steps",
    "boot",
    "other",
)


def process_start_time() -> float | None:
    """This process's start, seconds since the epoch (``starttime``, field 22 of
    ``/proc/self/stat``, in clock ticks since boot: proc(5)); None without /proc. On a VM the attempt
    starts when ``trainer.sh`` hands over to Python after its restart backoff
    (``MULTISLICE_ATTEMPT_STARTED``, seconds since the epoch: the backoff is a restart's boot, and the
    same process ran it), and an attempt the warm standby forked keeps its handoff's value (training.standby)."""
    handed = os.environ.get("MULTISLICE_ATTEMPT_STARTED")
    if handed:
        try:
            return float(handed)
        except ValueError:
            pass
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def account(
    events: list[dict[str, Any]],
    metrics: list[dict[str, Any]],
    tokens_per_step: float | None = None,
    flops_per_step: float | None = None,
    peak_flops_per_chip: float | None = None,
) -> dict[str, Any] | None:
    """Goodput and badput of a run from its records (all attempts, in the order written).

    Each cause counts only the time measured for it (docs/goodput.md, "Causes"); what no
    record explains is ``other``, so productive time and the causes add up to the wall time.

    Args:
      events: ``start`` (``time``, ``process_start``, ``restore_s``, ``restored``,
        ``devices``; optionally ``import_s``, ``join_s``), ``checkpoint`` (``time``,
        ``save_s``), ``preempted``/``complete`` (``time``; ``save_s``: the wait for the last
        async save) records; times in seconds since the epoch, durations in seconds.
      metrics: step records (``step``, ``time``, ``step_time_s``, ``includes_compile``) and
        eval records (``eval_s``).
      tokens_per_step, flops_per_step: for the rates; FLOPs per step as
        training.model.transformer.flops_per_token × tokens.
      peak_flops_per_chip: FLOP/s, for MFU.

    Returns:
      ``goodput`` (in [0, 1]), ``wall_seconds``, ``productive_seconds``, ``reduced_capacity_seconds``
      (the productive seconds of attempts on fewer slices than the stack's: elastic slices; part of
      ``productive_seconds``, never badput), ``badput`` (seconds by cause, :data:`CAUSES`), ``steps_lost``,
      ``attempts``, ``complete``, ``per_attempt``
      (one dict per attempt: its ``badput`` by cause, ``boot`` being the time before it,
      ``productive_seconds``, ``start_step``, ``restored``, ``ended`` — ``complete``,
      ``preempted`` or ``lost`` — and the ``start`` event's ``import_s``/``join_s`` when
      recorded) and, when the arguments allow, ``tokens_per_s``, ``tflops_per_chip``, ``mfu``;
      None before any start.
    """
    starts = sorted((e for e in events if e.get("event") == "start" and "time" in e), key=lambda e: e["time"])
    if not starts:
        return None
    timed = [r for r in events + metrics if "time" in r]
    complete = [float(e["time"]) for e in events if e.get("event") == "complete" and "time" in e]
    end = max(complete) if complete else max(float(r["time"]) for r in timed)
    steps = [m for m in metrics if "step_time_s" in m]
    steady = statistics.median([m["step_time_s"] for m in steps if not m.get("includes_compile")] or [0.0])
    kept = {id(m) for m in {m["step"]: m for m in steps}.values()}  # the last record of each step
    attempts, last_time = [], None
    for k, start in enumerate(starts):
        # A later process start than the previous attempt's last record (else one process ran both).
        begin = max(float(start.get("process_start") or start["time"]), last_time or 0.0)
        bound = float(starts[k + 1]["time"]) if k + 1 < len(starts) else float("inf")
        inside = [r for r in timed if float(start["time"]) <= float(r["time"]) < bound]
        attempt = _attempt(start, inside, kept, steady, begin, boot=begin - last_time if last_time is not None else 0.0)
        attempts.append(attempt)
        # (an attempt whose next start has the same time holds no record of its own: its own start)
        last_time = max((float(r["time"]) for r in inside), default=float(start["time"]))
    begin = float(starts[0].get("process_start") or starts[0]["time"])
    wall = max(end - begin, 0.0)
    badput: dict[str, float] = {cause: sum(a["badput"][cause] for a in attempts) for cause in CAUSES}
    productive = sum(a["productive_seconds"] for a in attempts)
    badput["other"] = max(0.0, wall - productive - sum(v for c, v in badput.items() if c != "other"))
    # Elastic slices: steps trained on fewer slices than the stack's are productive (the run advanced),
    # at reduced capacity; how long, so a reader sees it (docs/goodput.md, "Causes").
    reduced = sum(a["productive_seconds"] for a in attempts if a.get("slices", 0) < a.get("full_slices", 0))
    result = {
        "goodput": round(min(productive / wall, 1.0), 4) if wall > 0 else 0.0,
        "reduced_capacity_seconds": round(reduced, 3),
        "wall_seconds": round(wall, 3),
        "productive_seconds": round(productive, 3),
        "badput": {cause: round(seconds, 3) for cause, seconds in badput.items()},
        "steps_lost": len(steps) - len(kept),
        "attempts": len(starts),
        "complete": bool(complete),
        "per_attempt": [_rounded(a) for a in attempts],
    }
    if tokens_per_step and productive > 0:
        result["tokens_per_s"] = round(len(kept) * tokens_per_step / productive, 3)
        if flops_per_step:
            per_chip = len(kept) * flops_per_step / productive / int(starts[-1].get("devices", 1))
            result["tflops_per_chip"] = float(f"{per_chip / 1e12:.6g}")
            if peak_flops_per_chip:
                result["mfu"] = float(f"{per_chip / peak_flops_per_chip:.6g}")
    return result


def _attempt(
    start: dict[str, Any], inside: list[dict[str, Any]], kept: set[int], steady: float, begin: float, boot: float
) -> dict[str, Any]:
    """One attempt's badput by cause and productive seconds: from ``begin`` (its process start)
    to its last record, the ``inside`` records (those from its ``start`` event on)."""
    badput = dict.fromkeys(CAUSES, 0.0)
    badput["boot"] = boot
    restore = float(start.get("restore_s", 0.0)) if start.get("restored") else 0.0
    badput["checkpoint_restore"] = restore
    badput["initialization"] = float(start["time"]) - begin - restore
    productive = 0.0
    for m in (r for r in inside if "step_time_s" in r):
        compile_s = max(0.0, m["step_time_s"] - steady) if m.get("includes_compile") else 0.0
        badput["compilation"] += compile_s
        if id(m) in kept:
            productive += m["step_time_s"] - compile_s
        else:
            badput["recomputed_steps"] += m["step_time_s"] - compile_s
    # Saves block the loop for save_s: periodic and preemption checkpoints, and at the exit the
    # wait for the last async save to finalize (the async write overlapping steps is not badput).
    badput["checkpoint_save"] = sum(float(r.get("save_s", 0.0)) for r in inside)
    badput["evaluation"] = sum(float(r.get("eval_s", 0.0)) for r in inside)
    last = max((float(r["time"]) for r in inside), default=float(start["time"]))
    named = sum(v for c, v in badput.items() if c != "boot")
    badput["other"] = max(0.0, last - begin - named - productive)
    ends = [r.get("event") for r in inside if r.get("event") in ("preempted", "complete")]
    attempt = {
        "badput": badput,
        "productive_seconds": productive,
        "start_step": int(start.get("step", 0)),
        "restored": bool(start.get("restored")),
        "ended": ends[-1] if ends else "lost",
    }
    for phase in ("import_s", "join_s"):
        if phase in start:
            attempt[phase] = float(start[phase])
    for count in ("slices", "full_slices"):  # elastic slices: the job's and the stack's
        if isinstance(start.get(count), int):
            attempt[count] = int(start[count])
    return attempt


def _rounded(attempt: dict[str, Any]) -> dict[str, Any]:
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in attempt.items()}
    rounded["badput"] = {cause: round(seconds, 3) for cause, seconds in attempt["badput"].items()}
    return rounded
