"""Following what processes write: the trainer's records and the VMs' logs.

* :class:`RecordTail`: the new records of one of the trainer's logs (``metrics``, ``events``:
  ``training.metrics.run_log``) since the last poll, read from the run directory through its storage
  API. The trainer writes each sync window as a new object and never rewrites one, so a poll
  lists the log's objects (one request) and reads only those it has not read. A listing
  that went backwards (the run was discarded and started again) is read from its start.
* :class:`MetricsTail`: the newest training step and loss, and when it last advanced (the
  emulator's fault trigger and stall detector).
* :func:`record_problem`: why a record cannot be used (a step that is not an integer, a
  null or non-numeric loss or time); such records are skipped, with one warning per log.
* :func:`last_lines`: the end of a log file, for error messages.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.readers.files import open_regular
from training.metrics.run_log import parse_records, segments
from training.run_dir import RunDir
from training.warning_text import as_line, no_action

#: Fields that must be numbers (not booleans, not null) where a record has them.
_NUMBERS = ("loss", "eval_loss", "tokens_per_s", "time", "step_time_s")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def record_problem(name: str, record: dict[str, Any]) -> str | None:
    """Why a record of log ``name`` (``metrics``, ``events``) cannot be used, or None: its
    ``step`` is not an integer (a string, a float, null), a training record has no step, or a
    numeric field (loss, time, …) is null or not a finite number. A ``complete`` event may
    carry a null loss (a run that resumed at its last step)."""
    step = record.get("step")
    if "step" in record and not _is_int(step):
        return f"step {step!r} is not an integer"
    if name == "metrics" and "loss" in record and "step" not in record:
        return "a training record without a step"
    for key in _NUMBERS:
        if key in record and not _is_number(record[key]):
            if key == "loss" and record[key] is None and record.get("event") == "complete":
                continue
            return f"{key} {record[key]!r} is not a number"
    return None


def valid_records(name: str, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The usable records among ``records`` of log ``name``, and one line per skipped one."""
    kept, skipped = [], []
    for record in records:
        problem = record_problem(name, record)
        if problem is None:
            kept.append(record)
        else:
            skipped.append(f"{problem}: {str(record)[:120]}")
    return kept, skipped


class RecordTail:
    """New records of log ``name`` of ``run_dir`` (see the module docstring).

    Malformed records (:func:`record_problem`) are skipped; the first one is reported through
    ``warn`` (once per tail), with how to find the others.
    """

    def __init__(self, run_dir: RunDir, name: str, warn: Callable[[str], None] | None = None) -> None:
        self.run_dir = run_dir
        self.name = name
        self.warn = warn
        self.skipped = 0
        self._last = ""  # the newest object read; names sort in writing order

    def poll(self) -> list[dict[str, Any]]:
        """Records written since the last poll, in writing order; [] while there are none."""
        names = segments(self.run_dir, self.name)
        if names and names[-1] < self._last:
            self._last = ""
        records = []
        for name in names:
            if name > self._last:
                kept, skipped = valid_records(self.name, parse_records(self.run_dir.read(name) or b""))
                if skipped and not self.skipped and self.warn is not None:
                    more = "" if len(skipped) == 1 else f" (and {len(skipped) - 1} more in that object)"
                    warning = no_action(
                        f"skipped a malformed record of the run's {self.name} log ({name}): {skipped[0]}{more}; "
                        "further malformed records are skipped silently",
                        "the progress lines go on from the well-formed ones",
                    )
                    self.warn(as_line(warning))
                self.skipped += len(skipped)
                records += kept
                self._last = name
        return records


class MetricsTail(RecordTail):
    """Follows the ``metrics`` log: the newest step and loss, and when it last advanced.

    Attributes:
      last_step: step of the newest training record (one with ``loss``); 0 before any.
      last_loss: its loss, or None before any.
      last_change: ``time.monotonic()`` of the last poll that saw a training record (or of
        construction, or of the caller's reset).
    """

    def __init__(self, run_dir: RunDir, warn: Callable[[str], None] | None = None) -> None:
        super().__init__(run_dir, "metrics", warn)
        self.last_step = 0
        self.last_loss: float | None = None
        self.last_change = time.monotonic()
        self.attempt_began: float | None = None  # the newest attempt's start (seconds since the epoch)

    def resumed(self, step: int, began: float | None) -> None:
        """A new attempt started at ``step`` (its ``start`` event, read before the metrics it wrote):
        the newest step is that one until the attempt reports its own, and a record of an earlier
        attempt read later (its last window) no longer counts (by its ``time``, where it has one)."""
        if step < self.last_step:
            self.last_step, self.last_loss = step, None
        self.attempt_began = began

    def _current(self, record: dict[str, Any]) -> bool:
        when = record.get("time")
        return self.attempt_began is None or not isinstance(when, (int, float)) or when >= self.attempt_began

    def poll(self) -> list[dict[str, Any]]:
        records = super().poll()
        for record in records:
            if "loss" in record and self._current(record):
                self.last_step = int(record["step"])
                self.last_loss = float(record["loss"])
                self.last_change = time.monotonic()
        return records


#: The most of a log's end read for its last lines (:func:`last_lines`): the 20 lines an error message
#: quotes, each up to 12 KB. A longer log is read from this far before its end.
MAX_TAIL_BYTES = 256 << 10


def last_lines(path: Path, lines: int) -> list[str] | None:
    """The last ``lines`` lines of the text file ``path`` (undecodable bytes replaced), read from its
    last :data:`MAX_TAIL_BYTES`, or None if it cannot be read (not a regular file: a FIFO would
    block, a device never ends; ``infra.readers.files.open_regular``)."""
    try:
        fd = open_regular(path)
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - MAX_TAIL_BYTES)
            data = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace").splitlines()
    return (text[1:] if start else text)[-lines:]  # the first line read began before the start


def indented_tail(log: Path, lines: int = 15) -> str:
    """The end of a VM's log, indented under an error message ("" if there is none)."""
    return "\n".join("    " + line for line in last_lines(log, lines) or [])
