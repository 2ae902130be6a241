"""A picture of a run: training loss and tokens/s against step, with the run's restarts,
preemptions and checkpoint restores marked, and its goodput in the title (``--plot``).

Reads every ``metrics`` and ``events`` object of the run (one concurrent batch: a plot needs
the whole curve). Steps that were computed, lost with a process and recomputed from a
checkpoint are drawn in grey under the curve the run kept. matplotlib is imported here only,
with its non-interactive Agg backend (https://matplotlib.org/stable/users/explain/figure/backends.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.status.progress import RunProgress, restarts_of
from infra.status.report import badput_text
from infra.status.store import RunStore
from training.metrics.run_log import parse_records

#: Mark kinds, drawn in this order, with their colour and line style.
MARK_STYLES = {
    "preemption": ("tab:orange", "--"),
    "resize": ("tab:cyan", "-."),
    "failure": ("tab:red", "-"),
    "restore": ("tab:green", ":"),
}


@dataclass(frozen=True)
class History:
    """Every record of a run, in the order written: step records (``step``, ``loss``, …),
    eval records (``step``, ``eval_loss``) and events."""

    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    events: list[dict[str, Any]]


@dataclass(frozen=True)
class Mark:
    """A vertical mark at ``step``: ``kind`` (a key of :data:`MARK_STYLES`) and its label."""

    kind: str
    step: int
    label: str


def read_history(store: RunStore) -> History:
    """Every metrics and events record of the run in ``store``.

    Raises:
      infra.status.store.StoreError: the run directory cannot be read.
    """
    listings = store.list_many(["metrics", "events"])
    names = {folder: [e.name for e in entries if e.name.endswith(".jsonl")] for folder, entries in listings.items()}
    blobs = store.read(names["metrics"] + names["events"])
    metrics = [r for name in names["metrics"] for r in parse_records(blobs.get(name, b""))]
    events = [r for name in names["events"] for r in parse_records(blobs.get(name, b""))]
    return History(
        steps=[r for r in metrics if "loss" in r and "step" in r],
        evals=[r for r in metrics if "eval_loss" in r and "step" in r],
        events=events,
    )


def marks(events: list[dict[str, Any]], steps: list[dict[str, Any]] | None = None) -> list[Mark]:
    """The marks of a run's events: each preemption notice, and each elastic resize (a stop to
    change the slice count, :func:`training.metrics.restarts.restarts_of`), at the step its checkpoint saved;
    each failure (a restart that no preemption preceded) at the last step recorded before it
    (found in ``steps``, the step records in the order written: the step where the records go
    back to the resumed step + 1), else at the step it resumed from; and each checkpoint
    restore at the restored step."""
    order = [int(r["step"]) for r in steps or []]
    cursor = 0
    found = []
    for restart in restarts_of(events):
        resumed = restart.resumed_step
        reached = None
        for j in range(max(cursor, 1), len(order)):
            if order[j] == resumed + 1 and order[j - 1] >= resumed + 1:
                reached, cursor = order[j - 1], j
                break
        if restart.cause == "preemption" and restart.preempted_step is not None:
            found.append(Mark("preemption", restart.preempted_step, f"preemption: saved step {restart.preempted_step}"))
        elif restart.cause == "resize" and restart.preempted_step is not None:
            found.append(Mark("resize", restart.preempted_step, f"elastic resize: saved step {restart.preempted_step}"))
        elif restart.cause == "failure":
            at = reached if reached is not None else resumed
            found.append(
                Mark(
                    "failure",
                    at,
                    f"failure after step {at}" if reached is not None else f"failure: restart at step {at}",
                )
            )
        if restart.restored:
            found.append(Mark("restore", resumed, f"restored step {resumed}"))
    return found


def kept_and_recomputed(steps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The step records the run kept (the last one of each step) and those recomputed after a
    restart (an earlier record of a step recorded again), each sorted by step."""
    last = {}
    for index, record in enumerate(steps):
        last[int(record["step"])] = index
    kept = [steps[i] for i in sorted(last.values(), key=lambda i: int(steps[i]["step"]))]
    lost = [r for i, r in enumerate(steps) if last[int(r["step"])] != i]
    return kept, sorted(lost, key=lambda r: int(r["step"]))


#: The note in an empty plot: a run that has recorded no training step yet.
NO_STEPS_YET = "no training step recorded yet: the run is starting (boot, restore, first compile)"

#: Longest line of the title's goodput text (characters): a wider line is cut at the figure's edges.
TITLE_LINE_CHARS = 90


def figure_title(stack_title: str, run: RunProgress) -> str:
    """The figure title: the run, its state, and goodput with badput when known."""
    state = "COMPLETE" if run.complete else f"step {run.step or 0}/{run.total_steps}"
    lines = [f"{stack_title} ({state}, {len(run.restarts)} restarts, {run.preemptions} after a preemption)"]
    if run.goodput is not None:
        parts = f"goodput {run.goodput:.2f}; badput {badput_text(run.badput)}".split("; ")
        lines.append(parts[0])
        for part in parts[1:]:  # one cause never split; lines short enough for the figure's width
            if len(lines[-1]) + 2 + len(part) <= TITLE_LINE_CHARS:
                lines[-1] += "; " + part
            else:
                lines.append(part)
    return "\n".join(lines)


def draw(history: History, run: RunProgress, path: Path, title: str = "") -> Path:
    """Write the picture to ``path`` (PNG; parent folders created).

    Raises:
      OSError: ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept, lost = kept_and_recomputed(history.steps)
    figure, (loss_ax, rate_ax) = plt.subplots(2, 1, sharex=True, figsize=(10.5, 6), height_ratios=(3, 2))
    if lost:
        loss_ax.plot(
            [int(r["step"]) for r in lost],
            [float(r["loss"]) for r in lost],
            ".",
            color="0.6",
            label="recomputed after a restart",
        )
    loss_ax.plot(
        [int(r["step"]) for r in kept], [float(r["loss"]) for r in kept], color="tab:blue", label="training loss"
    )
    if history.evals:
        loss_ax.plot(
            [int(r["step"]) for r in history.evals],
            [float(r["eval_loss"]) for r in history.evals],
            "o",
            color="tab:purple",
            label="eval loss",
        )
    rated = [r for r in kept if isinstance(r.get("tokens_per_s"), (int, float)) and not r.get("includes_compile")]
    rate_ax.plot([int(r["step"]) for r in rated], [float(r["tokens_per_s"]) for r in rated], color="tab:gray")
    if not kept:  # the run exists but has recorded no step yet (booting, the first compile)
        loss_ax.text(0.5, 0.5, NO_STEPS_YET, transform=loss_ax.transAxes, ha="center", va="center", fontsize=10)
    loss_ax.set_ylabel("loss")
    rate_ax.set_ylabel("tokens/s")
    rate_ax.set_xlabel("step")
    rate_ax.set_xlim(0, max(run.total_steps, max((int(r["step"]) for r in kept), default=1)))
    labelled, labels = set(), {}
    for mark in marks(history.events, history.steps):
        colour, style = MARK_STYLES[mark.kind]
        for axis in (loss_ax, rate_ax):
            axis.axvline(
                mark.step,
                color=colour,
                linestyle=style,
                linewidth=1.4,
                label=mark.kind if axis is loss_ax and mark.kind not in labelled else None,
            )
        labelled.add(mark.kind)
        labels.setdefault(mark.step, []).append(mark.label)
    for step, texts in labels.items():  # one label per marked step, beside its lines
        loss_ax.annotate(
            "; ".join(texts),
            (step, 0.97),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            va="top",
            ha="left",
            xytext=(2, 0),
            textcoords="offset points",
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
        )
    loss_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the plot: never over a mark
    for axis in (loss_ax, rate_ax):
        axis.grid(alpha=0.3)
    figure.suptitle(figure_title(title, run), fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(path, format="png", dpi=110)
    finally:
        plt.close(figure)
    return path
