"""Following what processes write: the trainer's records and the VMs' logs.

* :class:`RecordTail`: the new records of one of the trainer's logs (``metrics``, ``events``:
  ``training.run_log``) since the last poll, read from the run directory through its storage
  API. The trainer writes each sync window as a new object and never rewrites one, so a poll
  lists the log's objects (one request) and reads only those it has not read. A listing
  that went backwards (the run was discarded and started again) is read from its start.
* :class:`MetricsTail`: the newest training step and loss, and when it last advanced (the
  emulator's fault trigger and stall detector).
* :func:`last_lines`: the end of a log file, for error messages.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from training.run_dir import RunDir
from training.run_log import parse_records, segments


class RecordTail:
    """New records of log ``name`` of ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: RunDir, name: str):
        self.run_dir = run_dir
        self.name = name
        self._last = ""  # the newest object read; names sort in writing order

    def poll(self) -> list[dict[str, Any]]:
        """Records written since the last poll, in writing order; [] while there are none."""
        names = segments(self.run_dir, self.name)
        if names and names[-1] < self._last:
            self._last = ""
        records = []
        for name in names:
            if name > self._last:
                records += parse_records(self.run_dir.read(name) or b"")
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

    def __init__(self, run_dir: RunDir):
        super().__init__(run_dir, "metrics")
        self.last_step = 0
        self.last_loss: float | None = None
        self.last_change = time.monotonic()

    def poll(self) -> list[dict[str, Any]]:
        records = super().poll()
        for record in records:
            if "loss" in record:
                self.last_step = int(record["step"])
                self.last_loss = float(record["loss"])
                self.last_change = time.monotonic()
        return records


def last_lines(path: Path, lines: int) -> list[str] | None:
    """The last ``lines`` lines of the text file ``path`` (undecodable bytes replaced), or
    None if it cannot be read."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return None


def indented_tail(log: Path, lines: int = 15) -> str:
    """The end of a VM's log, indented under an error message ("" if there is none)."""
    return "\n".join("    " + line for line in last_lines(log, lines) or [])
