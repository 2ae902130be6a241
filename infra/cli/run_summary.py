"""The run summary ``multislice local up`` prints when a run ends: one row per figure of the
summary :mod:`infra.local.summary` computes, in a fixed order; a figure with no value says why
(a dash and the reason, never ``None``). The table is at most :data:`SUMMARY_WIDTH` columns wide,
in a terminal, a pipe or a file: a list (restart causes, slice changes, faults) takes a line per item
and a long one wraps within its cell. The run's and the logs' folders follow the table, one line
each, never wrapped: a path is copied or searched for whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.table import Table
from rich.text import Text

from infra.cli.options import console, fail

#: Widest the summary table is drawn (columns).
SUMMARY_WIDTH = 100
#: Rows printed after the table, unwrapped.
_PATHS = ("run_dir", "logs_dir")


def print_summary(result: dict) -> None:
    table = Table(show_header=False)  # the title on its own line: a table title is padded to the table's width
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for key in (
        "complete",
        "steps_completed",
        "total_steps",
        "final_loss",
        "final_eval_loss",
        "restarts",
        "restart_causes",
        "slice_changes",
        "unplanned_restarts",
        "steps_lost",
        "training_seconds",
        "wall_seconds",
        "goodput",
        "reduced_capacity_seconds",
        "idle_capacity_slice_seconds",
        "badput",
        "faults",
        "capacity",
    ):
        if key in result:
            value = result[key]
            if value is None:
                table.add_row(key, Text(_absent(key, result)))
                continue
            if key == "faults" and len(result.get("fault_steps") or []) == len(value):
                value = [f"{f} (fired after step {s})" for f, s in zip(value, result["fault_steps"], strict=True)]
            if isinstance(value, float):
                value = f"{value:.4f}"
            elif isinstance(value, list):
                value = "\n".join(value) or "none"
            table.add_row(key, Text(str(value)))
    console.print("run summary")
    console.print(table, width=min(console.width, SUMMARY_WIDTH))
    for key in _PATHS:
        if result.get(key):
            console.print(f"{key}: {result[key]}", markup=False, soft_wrap=True)


def _absent(key: str, result: dict) -> str:
    """What the summary shows for a row with no value: a dash and why, never ``None``."""
    if key == "final_eval_loss":
        every = result.get("eval_every_steps") or 0
        if not every:
            return "— (no evaluation: multislice:training.eval_every_steps is 0)"
        return f"— (no evaluation: eval every {every} steps, the run had {result.get('steps_completed', 0)})"
    if key == "final_loss":
        return "— (no step completed yet)"
    return "— (not recorded yet)"


def summary_path_problem(path: Path) -> str | None:
    """Why ``--summary-json`` ``path`` cannot be written as a file, or None (checked before any work starts)."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent if str(path.parent) else Path(".")
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"{existing or parent} is not a directory"
    if not os.access(existing, os.W_OK):
        return f"{existing} is not writable"
    return None


def write_summary_json(path: Path | None, result: dict) -> None:
    """Write ``result`` to ``--summary-json`` ``path`` (None: nothing); a failure is one error line, exit 1."""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        except OSError as err:
            raise fail(f"--summary-json {path}: {err.strerror or err}", 1) from None
