"""What ``multislice local up`` shows while a run goes on: boot phases and training progress.

* :class:`BootLines`: the boot-phase lines of one emulated VM's console log as they are
  written (the startup script's ``boot:``, ``release:``, ``venv:``, ``trainer:`` lines
  and the trainer's INFO lines until the first step: ``jax.distributed.initialize``, the data,
  the mesh), so the minute between "booting" and "training started" is not silent.
* :class:`ProgressTail`: the ``metrics`` log tail (:class:`infra.local.tails.MetricsTail`)
  that also keeps the trainer's newest ``tokens_per_s``.
* :class:`ProgressSample`: one progress observation (step / total, loss, tokens/s, restarts).
* :class:`RunReporter`: what the emulator reports as the run goes on: the trainer's events
  (start, resume, preemption checkpoint, restore fallback), the first VM's boot lines until
  training starts, and progress.
* :class:`plain_reporter` (no terminal: one unwrapped line per sync window, at most every
  ``min_interval_s``, at every tenth of the run, when the restarts change, and the last step
  seen at the end) and :func:`live_reporter` (a terminal: a
  rich progress bar with step/total, loss, tokens/s, ETA and restarts;
  https://rich.readthedocs.io/en/stable/progress.html).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.local.tails import MetricsTail, RecordTail
from training.warning_text import as_line, no_action

if TYPE_CHECKING:
    from rich.console import Console

    from training.run_dir import RunDir

#: A boot-phase line of the console log after the ``[slice S worker W] `` prefix: the startup
#: script's phases, whole lines of their own.
_PHASE = re.compile(r"^(?:boot|release|venv|trainer|error|warning): .*$")
#: The trainer's INFO lines (``HH:MM:SS INFO [pN] training...: text``). The trainer's stdout and
#: stderr are one stream, and gloo's C++ threads write their lines to it in pieces: one may come
#: before a record on its line, so a record is found anywhere in the line.
_TRAINER = re.compile(r"\d\d:\d\d:\d\d (?:INFO|WARNING|ERROR) \[p\d+\] (training[\w.]*: .*)$")


#: Trainer exit statuses of the exit-code contract (docs/workloads.md): complete, preempted,
#: superseded by a newer release, a configuration that cannot work. Any other is a failure.
CONTRACT_STATUSES = (0, 75, 76, 78)


class BootLines:
    """New boot-phase lines of the console log ``path`` of VM ``name`` (``slice S worker W``);
    ``every_vm``: the command that shows every VM's lines (said once, with the first line shown)."""

    def __init__(self, name: str, path: Path, every_vm: str = "") -> None:
        self.name = name
        self.path = path
        self.every_vm = every_vm
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def poll(self) -> list[str]:
        """The phase lines (prefix and timestamp removed) written since the last poll."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:
            return []
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        prefix = f"[{self.name}] "
        found = []
        for raw in complete:
            line = raw.decode(errors="replace")
            if not line.startswith(prefix):
                continue
            text = line[len(prefix) :]
            if _PHASE.fullmatch(text):
                found.append(text)
            elif record := _TRAINER.search(text):
                found.append(record[1])
        return found


class ProgressTail(MetricsTail):
    """:class:`MetricsTail` that also keeps ``last_tokens_per_s`` (the trainer's own figure)."""

    def __init__(self, run_dir: RunDir, warn: Callable[[str], None] | None = None) -> None:
        super().__init__(run_dir, warn)
        self.last_tokens_per_s: float | None = None

    def resumed(self, step: int, began: float | None) -> None:
        if step < self.last_step:
            self.last_tokens_per_s = None
        super().resumed(step, began)

    def poll(self) -> list[dict[str, Any]]:
        records = super().poll()
        for record in records:
            if "tokens_per_s" in record and self._current(record):
                self.last_tokens_per_s = float(record["tokens_per_s"])
        return records


@dataclasses.dataclass(frozen=True)
class ProgressSample:
    """One observation of a run: ``step`` of ``total`` optimizer steps, the step's ``loss``,
    the trainer's ``tokens_per_s`` (None before it reported one) and the ``restarts`` so far."""

    step: int
    total: int
    loss: float | None
    tokens_per_s: float | None
    restarts: int

    def line(self) -> str:
        """``step 40/120  loss 2.3602  1,234 tokens/s  restarts 1``."""
        return f"step {self.step}/{self.total}  {self.detail()}"

    def detail(self) -> str:
        """The line without its step (what the progress bar shows next to the bar)."""
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        parts.append(f"restarts {self.restarts}")
        return "  ".join(parts)


class RunReporter:
    """Reports a run of ``multislice local up`` as it goes on, through ``report``.

    Args:
      report: ``(line) -> None``.
      progress: ``(ProgressSample) -> None`` at each new training step or restart seen (None: a
        ``report`` line at each tenth of the run).

    The emulator sets :attr:`events` (the run's events log) and :attr:`boot_lines` (the first
    VM's console log) once they exist.
    """

    def __init__(self, report: Callable[[str], None], progress: Callable[[ProgressSample], None] | None = None) -> None:
        self.report = report
        self.on_progress = progress
        self.events: RecordTail | None = None
        self.boot_lines: BootLines | None = None
        self.following_boot = True  # reporting boot lines until training starts
        self.after_repair = False  # the boot lines shown follow a repair (:meth:`drain`)
        self._said_whose = False
        #: Trainer ``start`` events of the run seen (the caller adds those of earlier runs).
        self.starts = 0
        #: What the emulator stopped the trainers for, until the next start (``"the reset"``): a stop
        #: notice the trainer records as a preemption's, named as what it was.
        self.stopping_for: str | None = None

    @property
    def restarts(self) -> int:
        """Trainer starts after the first, counted as the run summary counts them
        (:mod:`infra.local.summary`): every restart, a repair's or systemd's, shows."""
        return max(self.starts - 1, 0)

    def event(self, event: dict[str, Any]) -> None:
        """One record of the events log, as a line (events without one are not reported)."""
        kind, step = event.get("event"), event.get("step")
        if kind == "start":
            self.starts += 1
            self.stopping_for = None
            how = "resumed from the checkpoint of step" if event.get("restored") else "started at step"
            sizes = ", ".join(f"{event[k]} {k}" for k in ("processes", "devices") if event.get(k) is not None)
            if event.get("full_slices") and event.get("slices") != event.get("full_slices"):
                sizes += f"; {event.get('slices')} of {event['full_slices']} slices"  # elastic: some are lost
            self.report(f"training {how} {step}" + (f" ({sizes})" if sizes else ""))
        elif kind == "checkpoint" and event.get("preemption") and self.stopping_for:
            self.report(f"checkpoint saved at step {step} on the stop notice of {self.stopping_for}")
        elif kind == "preempted" and self.stopping_for:
            self.report(f"training stopped after the checkpoint of step {step} for {self.stopping_for}")
        elif kind == "checkpoint" and event.get("preemption"):
            self.report(f"preemption checkpoint saved at step {step}")
        elif kind == "preempted" and event.get("membership_epoch") is not None:
            self.report(f"training stopped at the checkpoint of step {step} to change its slice count (elastic)")
        elif kind == "preempted":
            self.report(f"training stopped after the preemption checkpoint of step {step}")
        elif kind == "restore_fallback":
            self.report(
                f"restore fell back from the checkpoint of step {event.get('tried')} ({event.get('path')}): "
                f"{event.get('reason')}; resuming from step {step}"
            )

    def drain(self, repair: bool = False) -> None:
        """Report the events written so far (e.g. the preemption checkpoint a fault caused)
        before what follows them (``repair``: a repair; else a reset): events print in causal
        order. Boot lines are followed again for the next boot."""
        if self.events is not None:
            for event in self.events.poll():
                self.event(event)
        if self.boot_lines is not None:
            self.boot_lines.poll()  # skip the stopped boot's last lines
            self.following_boot = True
            self.after_repair = repair

    def boot(self) -> None:
        """Until training starts, the first VM's boot-phase lines as they are written (the first
        time, with a line saying whose they are and how to see every VM's). After a repair, a
        trainer that ended with a status outside the exit-code contract (its job lost a peer)
        is said to be part of the repair."""
        if self.boot_lines is None:
            return
        lines = self.boot_lines.poll()
        if not self.following_boot:
            return
        name = self.boot_lines.name
        if lines and not self._said_whose and self.boot_lines.every_vm:
            self._said_whose = True
            self.report(f"{name}'s lines only, for brevity; every VM's: {self.boot_lines.every_vm}")
        for line in lines:
            exited = re.match(r"trainer: exited with status (\d+) ", line)
            if self.after_repair and exited and int(exited[1]) not in CONTRACT_STATUSES:
                line += ": expected in the repair (its job lost a peer); the repair restarts it"
            self.report(f"{name}: {line}")
            if line.startswith("training: starting at step"):
                self.following_boot = False
                self.after_repair = False
                break  # what follows in this poll is training's, not the boot's

    def progress(self, tail: MetricsTail, previous_step: int, total: int, restarts: int) -> None:
        """Report progress: to ``progress`` at each new step or restart seen, else a line each
        time training passes a tenth of the run (records arrive one sync window at a time) and
        at the last step."""
        if self.on_progress is not None:
            self.on_progress(
                ProgressSample(
                    tail.last_step, total, tail.last_loss, getattr(tail, "last_tokens_per_s", None), restarts
                )
            )
            return
        every = max(1, total // 10)
        if tail.last_step != previous_step and (
            tail.last_step // every != previous_step // every or tail.last_step == total
        ):
            self.report(f"step {tail.last_step}/{total}  loss {tail.last_loss:.4f}")


class plain_reporter:
    """Progress as lines through ``report`` (no terminal): at each tenth of the run, at the
    last step, when the restart count changes, and otherwise at most one every
    ``min_interval_s`` seconds. Called with each :class:`ProgressSample`; as a context manager
    (returning itself), on leaving it prints the newest sample if it was not printed: piped
    output ends at the step the terminal's bar ends at (a run stopped between two tenths)."""

    def __init__(self, report: Callable[[str], None], min_interval_s: float = 10.0) -> None:
        self.report = report
        self.min_interval_s = min_interval_s
        self.last: ProgressSample | None = None  # the last one printed
        self.newest: ProgressSample | None = None  # the last one seen
        self.last_time = float("-inf")

    def __call__(self, progress: ProgressSample) -> None:
        self.newest = progress
        every = max(1, progress.total // 10)
        now = time.monotonic()
        last = self.last
        if (
            last is None
            or progress.step // every != last.step // every
            or progress.step == progress.total
            or progress.restarts != last.restarts
            or now - self.last_time >= self.min_interval_s
        ):
            self.report(progress.line())
            self.last, self.last_time = progress, now

    def __enter__(self) -> plain_reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.newest is not None and self.newest is not self.last:
            try:
                self.report(self.newest.line())
            except OSError:  # a closed stdout: nobody reads the line
                pass
            self.last = self.newest


class live_reporter:
    """A rich progress bar on ``console`` for the block (a context manager returning the
    ``(ProgressSample) -> None`` callback); lines printed on ``console`` meanwhile appear above it."""

    def __init__(self, console: Console, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, detail="booting")

    def __enter__(self) -> Callable[[ProgressSample], None]:
        self.progress.start()
        return self.show

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def show(self, progress: ProgressSample) -> None:
        self.progress.update(self.task, completed=progress.step, detail=progress.detail())


class MembershipChanges:
    """Each change of an elastic run's slice count, reported as the membership records and the run's
    events show it, read at most every ``every_s`` seconds (a listing of the run directory each time):
    ``elastic: slices 1 → 2 decided (…)`` once the record is there, then ``elastic: slices 1 → 2 at step
    24 (…)`` once a job took it over (:func:`training.membership.landing_steps`: a running job may train
    to its next checkpoint after a change is decided); only the second when both are seen at once."""

    def __init__(self, run_dir: Any, report: Callable[[str], None], every_s: float = 2.0) -> None:
        self.run_dir, self.report, self.every_s = run_dir, report, every_s
        self.events: list[dict[str, Any]] = []
        self.decided: set[int] = set()
        self.landed: set[int] = set()
        self.read_at = 0.0
        self.warned = False

    def event(self, event: dict[str, Any]) -> None:
        """Take in one of the run's events (those naming a membership epoch matter)."""
        if "membership_epoch" in event:
            self.events.append(event)

    def poll(self) -> None:
        from training import membership

        if time.monotonic() - self.read_at < self.every_s:
            return
        self.read_at = time.monotonic()
        try:
            records = membership.history(self.run_dir)
        except (OSError, membership.MembershipError) as err:
            if not self.warned:
                warning = no_action(
                    f"the membership records cannot be read ({err})",
                    "only these elastic progress lines wait for them (the trainer reads the records itself)",
                )
                self.report(as_line(warning))
            self.warned = True
            return
        landed = membership.landing_steps(self.events) or {}
        for before, after in zip(records, records[1:], strict=False):
            if after.epoch in self.landed:
                continue
            if after.epoch in landed:
                self.report(f"elastic: {membership.describe_change(before, after, landed[after.epoch])}")
                self.landed.add(after.epoch)
            elif after.epoch not in self.decided:
                self.report(f"elastic: slices {len(before.slices)} → {len(after.slices)} decided ({after.reason})")
            self.decided.add(after.epoch)
