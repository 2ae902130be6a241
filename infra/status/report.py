"""A stack's status: its capacity and its run's progress, as JSON and as a rich table.

``--json`` prints :meth:`StackStatus.to_json`; its keys are stable (new keys may be added,
none renamed or removed). Times are seconds since the epoch, durations seconds, and a value
not known yet is ``null``::

    stack                 the stack name
    emulated              true for ``multislice local status``
    checked_at            when the status was read
    queued_resource       {id, state, emulated, detail, backend, slices: [{slice, node, state,
                          health, vms_running, vms, instances}]}; state is a queued-resource
                          state (ACTIVE, WAITING_FOR_RESOURCES, FAILED, SUSPENDED, …), DELETED
                          (gone after its run completed: deleteOnComplete; no slices) or
                          NOT_RUNNING (an emulation that is not running); a slice's state is
                          its node's (READY, PREEMPTED, …, MISSING when the node does not
                          exist). backend is multislice:backend; on compute-engine id is the
                          stem of the instance group names, state READY or NOT_READY, a
                          slice's node its instance group, its state READY, NOT_READY or
                          MISSING, and instances its VMs in worker order ([{name, status,
                          action}]: infra/status/instance_groups.py); null elsewhere
    run                   run_dir, exists, step, total_steps, fraction (in [0, 1]), loss (the
                          latest step's training loss), eval_loss, tokens_per_s and
                          step_time_s (this attempt's latest window, the compile step left
                          out), eta_seconds, last_checkpoint_step, last_checkpoint_at,
                          started_at, updated_at, training_seconds (first start to the latest
                          record, or to completion), restarts, preemptions, restart_history
                          ([{cause: preemption|failure, resumed_step, resumed_at, restored,
                          preempted_step, preempted_at}]), complete, completed_step,
                          completed_at, goodput (in [0, 1]) and badput (seconds by cause) of
                          the trainer's goodput.json, when present, and goodput_at
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from infra.backends import operations
from infra.backends.capacity import CapacityStatus
from infra.clock import clock
from infra.status.progress import RunProgress


@dataclass
class StackStatus:
    """One reading of a stack's status."""

    stack: str
    capacity: CapacityStatus
    run: RunProgress
    checked_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "emulated": self.capacity.emulated,
            "checked_at": round(self.checked_at, 3),
            "queued_resource": self.capacity.to_json(),
            "run": self.run.to_json(),
        }


def headline(status: StackStatus) -> str:
    """The first line: the stack and its capacity state in words."""
    cap = status.capacity
    backend = operations.backend(cap.backend)
    if cap.emulated:
        if cap.state == "DELETED":
            return f"stack {status.stack}: not running; its {backend.deleted_name(cap)} was deleted"
        if cap.state == "NOT_RUNNING":
            return f"stack {status.stack}: {cap.detail}" if cap.detail else f"stack {status.stack}: not running"
        return f"stack {status.stack}: running ({cap.detail})"
    return backend.headline(status.stack, cap)


def duration(seconds: float | None) -> str:
    """``1h02m03s``, ``2m05s`` or ``7s`` (``-`` when unknown)."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def badput_text(badput: dict[str, float] | None) -> str:
    """``boot 90.1 s; compilation 20.3 s`` (largest first; causes under 0.05 s left out)."""
    causes = sorted(((s, c) for c, s in (badput or {}).items() if s >= 0.05), reverse=True)
    return "; ".join(f"{cause} {seconds:.1f} s" for seconds, cause in causes) or "none"


def restart_lines(run: RunProgress) -> list[str]:
    """One line per restart: when, why, and the step it resumed from."""
    lines = []
    for restart in run.restarts:
        if restart.cause == "preemption":
            why = f"preemption at step {restart.preempted_step} ({clock(restart.preempted_at)})"
        elif restart.cause == "resize":
            why = f"change of slice count (elastic) at step {restart.preempted_step} ({clock(restart.preempted_at)})"
        else:
            why = "failure"
        source = (
            f"checkpoint of step {restart.resumed_step}"
            if restart.restored
            else f"step {restart.resumed_step} (no checkpoint)"
        )
        lines.append(f"{clock(restart.resumed_at)} {why}, resumed from the {source}")
    return lines


def _capacity_rows(table: Table, capacity: CapacityStatus) -> None:
    spec = operations.backend(capacity.backend).spec
    label = f"emulated {spec.capacity_noun}" if capacity.emulated else spec.capacity_noun
    table.add_row(
        label, Text(f"{capacity.id}: {capacity.state}" + (f" ({capacity.detail})" if capacity.detail else ""))
    )
    for item in capacity.slices:
        parts = [item.node, item.state]
        if item.health:
            parts.append(item.health)
        if item.vms is not None:
            parts.append(f"{item.vms_running}/{item.vms} {spec.worker_noun} running")
        table.add_row(f"slice {item.slice}", Text("  ".join(parts)))
        for worker, instance in enumerate(item.instances or []):
            table.add_row(
                "", Text(f"worker {worker}: {instance.name}  {instance.status or 'not created'}  {instance.action}")
            )


def render(status: StackStatus) -> Table:
    """The status as a two-column table (what ``multislice status`` prints)."""
    run, now = status.run, status.checked_at
    table = Table(show_header=False)
    _capacity_rows(table, status.capacity)
    table.add_row("run_dir", Text(run.run_dir))
    if not run.exists:
        table.add_row("run", Text("no run yet"))
        return table
    done = run.completed_step if run.complete else run.step
    bar = ProgressBar(total=max(run.total_steps, 1), completed=min(done or 0, run.total_steps), width=30)
    table.add_row(
        "step", Group(Text(f"{done if done is not None else '-'}/{run.total_steps}  {run.fraction:.0%}"), bar)
    )
    if run.complete:
        table.add_row("complete", Text(f"COMPLETE at {clock(run.completed_at)} (step {run.completed_step})"))
    elif status.capacity.emulated and status.capacity.state in ("NOT_RUNNING", "DELETED"):
        table.add_row("eta", Text("- (nothing runs the trainer: `local up` resumes the run)"))
    else:
        table.add_row(
            "eta",
            Text(f"{duration(run.eta_seconds)}" + (f" ({run.step_time_s:.3g} s/step)" if run.step_time_s else "")),
        )
    if run.loss is not None:
        table.add_row("loss", Text(f"{run.loss:.4f} (step {run.step})"))
    if run.eval_loss is not None:
        table.add_row("eval_loss", Text(f"{run.eval_loss:.4f}"))
    table.add_row("tokens_per_s", Text(f"{run.tokens_per_s:,.0f}" if run.tokens_per_s is not None else "-"))
    if run.last_checkpoint_step is not None:
        table.add_row("last_checkpoint", Text(f"step {run.last_checkpoint_step} at {clock(run.last_checkpoint_at)}"))
    else:
        table.add_row("last_checkpoint", Text("none yet"))
    if run.goodput is not None:
        table.add_row(
            "goodput", Text(f"{run.goodput:.3f} (as of {clock(run.goodput_at)}); badput {badput_text(run.badput)}")
        )
    if run.slices is not None and run.full_slices is not None and not run.complete:
        fewer = " (elastic: the others are lost; training at reduced capacity)" if run.slices < run.full_slices else ""
        table.add_row("slices", Text(f"{run.slices} of {run.full_slices}{fewer}"))
    table.add_row("restarts", Text(f"{len(run.restarts)} ({run.preemptions} after a preemption)"))
    for line in restart_lines(run):
        table.add_row("", Text(line))
    table.add_row("training_seconds", Text(f"{run.training_seconds:.1f}" if run.training_seconds is not None else "-"))
    if run.updated_at is not None and not run.complete:
        table.add_row("updated", Text(f"{clock(run.updated_at)} ({duration(max(now - run.updated_at, 0))} ago)"))
    return table
