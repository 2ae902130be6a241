"""The summary of a run, computed from what the trainer wrote in its run directory (read
through the run directory's storage API, as the trainer wrote it: ``training.run_dir``).

* ``steps_completed``: highest step with a metrics record (or the completion marker's);
* ``final_loss``: training loss of that step's last record;
* ``final_eval_loss``: the last evaluation's loss, None when none ran (``eval_every_steps``, also
  recorded, is 0 or past the steps the run completed);
* ``restarts``: trainer starts after the first (``start`` events);
* ``restart_causes``: each restart named (:func:`describe_restart`): ``preemption`` when the
  attempt before it recorded a preemption notice, else ``failure`` (a fault, a trainer that ended
  with an error: ``training.metrics.restarts.restarts_of``), and the step it resumed at; a
  ``local reset``'s restart is named as the user's (:func:`name_resets`), as is the resume of an
  earlier ``local up`` (:func:`name_own_resume`);
* ``steps_lost``: step records written again after a restart — work computed, lost with
  the process and recomputed from the last checkpoint (steps of a window that was never
  synced are not seen, so this is a lower bound: ``training.metrics.run_log``);
* ``complete``: a valid completion marker for at least ``total_steps`` exists;
* ``training_seconds``: from the run's first start to its last event (all attempts, across
  every ``local up`` of the run);
* ``slice_changes``: each change of the slice count (elastic slices), from the run's membership
  records (:mod:`training.membership`);
* ``goodput`` (in [0, 1]) and ``badput`` (seconds by cause): :func:`training.metrics.goodput.account`
  over every attempt, from the first process start to the ``complete`` event (or the last
  record); the trainer writes the same report as ``goodput.json``.
"""

from __future__ import annotations

from typing import Any

from infra.local.tails import valid_records
from training import membership
from training.checkpoint.completion import read_completion
from training.metrics import goodput
from training.metrics.restarts import Restart, restarts_of
from training.metrics.run_log import read_records
from training.run_dir import RunDir


class Badput(dict):
    """Seconds by cause (a dict, so JSON as one); printed as ``cause 1.2 s; …``, largest first."""

    def __str__(self) -> str:
        causes = sorted(((s, c) for c, s in self.items() if s >= 0.05), reverse=True)
        return "; ".join(f"{cause} {seconds:.1f} s" for seconds, cause in causes) or "none"


def summarize(run_dir: RunDir, total_steps: int, eval_every_steps: int = 0) -> dict[str, Any]:
    """Summary dict of the run in ``run_dir`` (see module docstring); ``eval_every_steps`` (the
    stack's ``multislice:training.eval_every_steps``, 0: off) is recorded with it, to say why a
    run has no ``final_eval_loss``."""
    metrics = valid_records("metrics", read_records(run_dir, "metrics"))[0]  # malformed: skipped
    events = valid_records("events", read_records(run_dir, "events"))[0]
    steps = [m for m in metrics if "loss" in m]
    evals = [m for m in metrics if "eval_loss" in m]
    completion = read_completion(run_dir)
    steps_completed = max((int(m["step"]) for m in steps), default=0)
    if completion and completion.get("step") is not None:
        steps_completed = max(steps_completed, int(completion["step"]))
    final = [m for m in steps if int(m["step"]) == steps_completed]
    starts = [e for e in events if e.get("event") == "start"]
    times = [float(e["time"]) for e in events if "time" in e]
    report = goodput.account(events, metrics)
    return {
        "run_dir": str(run_dir),
        "complete": completion is not None and completion["step"] >= total_steps,
        "steps_completed": steps_completed,
        "total_steps": total_steps,
        "final_loss": float(final[-1]["loss"]) if final else None,
        "final_eval_loss": float(evals[-1]["eval_loss"]) if evals else None,
        "eval_every_steps": eval_every_steps,
        "restarts": max(len(starts) - 1, 0),
        "restart_causes": [describe_restart(r) for r in restarts_of(events)],
        "steps_lost": len(steps) - len({int(m["step"]) for m in steps}),
        "training_seconds": round(max(times) - min(times), 3) if times else None,
        "goodput": report["goodput"] if report else None,
        # elastic slices: productive time on fewer slices than the stack's (never badput); shown when any
        **(
            {"reduced_capacity_seconds": report["reduced_capacity_seconds"]}
            if report and report.get("reduced_capacity_seconds")
            else {}
        ),
        "badput": Badput(report["badput"] if report else {}),
        "slice_changes": slice_changes(run_dir, events),
    }


def slice_changes(run_dir: RunDir, events: list[dict[str, Any]] | None = None) -> list[str]:
    """Each change of the run's slice count (elastic slices: :func:`training.membership.describe_changes`,
    at the step the change took effect where its ``events`` say: :func:`training.membership.landing_steps`),
    or the one line of a membership record that cannot be read; empty for a run that never changed."""
    try:
        return membership.describe_changes(membership.history(run_dir), membership.landing_steps(events or []))
    except membership.MembershipError as err:
        return [str(err)]


def describe_restart(restart: Restart) -> str:
    """``failure: resumed at step 40`` / ``preemption at step 60: resumed at step 60`` /
    ``failure: started again from the seed``."""
    cause = "elastic resize" if restart.cause == "resize" else restart.cause
    if restart.cause in ("preemption", "resize") and restart.preempted_step is not None:
        cause += f" at step {restart.preempted_step}"
    resumed = f"resumed at step {restart.resumed_step}" if restart.restored else "started again from the seed"
    return f"{cause}: {resumed}"


#: How the summary names the restart with which a ``local up`` resumed a run an earlier one left
#: (stopped by ``local down``, Ctrl-C, a closed terminal, or an emulator that died).
RESUMED_BY_YOU = "your earlier local up stopped"


def own_resume(events: list[dict], since: float) -> int | None:
    """The index, in the restarts of the run whose ``events`` these are (``restart_causes``), of
    the restart with which the ``local up`` started at ``since`` (Unix seconds) resumed the run:
    its first start, when the run had started before; None for a new run."""
    if not any(e.get("event") == "start" and _before(e, since) for e in events):
        return None
    restarts = restarts_of(events)
    return next((i for i, r in enumerate(restarts) if r.resumed_at is not None and r.resumed_at >= since), None)


def name_own_resume(summary: dict, run_dir: RunDir, since: float) -> None:
    """Name, in ``summary["restart_causes"]``, the restart with which this ``local up`` resumed
    the run as the user's (:data:`RESUMED_BY_YOU`: ``your earlier local up stopped: resumed at step
    40``), not as a failure or a preemption."""
    index = own_resume(valid_records("events", read_records(run_dir, "events"))[0], since)
    causes = summary.get("restart_causes") or []
    if index is not None and index < len(causes):
        causes[index] = f"{RESUMED_BY_YOU}: {causes[index].split(': ', 1)[-1]}"


#: How the summary names a restart that a ``local reset`` of this ``local up`` caused.
RESET_BY_YOU = "your reset"


def name_resets(summary: dict, run_dir: RunDir, reset_times: list[float]) -> None:
    """Name, in ``summary["restart_causes"]``, each restart that a ``local reset`` at one of
    ``reset_times`` (Unix seconds) caused: the first restart that resumed after it
    (:data:`RESET_BY_YOU`: ``your reset at step 93: resumed at step 93``). The trainer records a
    reset's stop notice as a preemption's (it cannot tell them apart); the emulator knows."""
    restarts = restarts_of(valid_records("events", read_records(run_dir, "events"))[0])
    causes = summary.get("restart_causes") or []
    taken: set[int] = set()
    for at in sorted(reset_times):
        index = next(
            (i for i, r in enumerate(restarts) if i not in taken and r.resumed_at is not None and r.resumed_at >= at),
            None,
        )
        if index is None or index >= len(causes):
            continue
        taken.add(index)
        restart = restarts[index]
        where = f" at step {restart.preempted_step}" if restart.preempted_step is not None else ""
        causes[index] = f"{RESET_BY_YOU}{where}: {causes[index].split(': ', 1)[-1]}"


def _before(event: dict, since: float) -> bool:
    value = event.get("time")
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value < since


def unplanned_restarts(run_dir: RunDir, since: float, planned: int) -> list[str]:
    """The restarts of the run in ``run_dir`` whose start came at or after ``since`` (Unix
    seconds) beyond the first ``planned`` of them (the faults and resets the emulator carried
    out) and beyond this ``local up``'s own resume of an earlier run (:func:`own_resume`), each
    described (:func:`describe_restart`): restarts nothing asked for, such as a trainer that failed
    or was disturbed by another process. An elastic run's own stops to change its slice count
    (``Restart.own_resize``) are not counted; a resize that a fault caused (a preempted slice the run
    then trains without) is, against that fault."""
    events = valid_records("events", read_records(run_dir, "events"))[0]
    recent = [r for r in restarts_of(events) if r.resumed_at is not None and r.resumed_at >= since and not r.own_resize]
    resumed = 1 if own_resume(events, since) is not None else 0
    return [describe_restart(r) for r in recent[planned + resumed :]]
