"""Following what processes write: the trainer's JSON-lines records and the VMs' logs.

* :class:`JsonlTail`: the complete new records of a JSON-lines file since the last poll. A
  last line without its newline is left for a later poll (the writer may be mid-record); a
  line that never parses (a record torn by a killed writer, which the next writer ends with
  a newline: ``training.run_log``) is skipped. A file that shrank or was replaced is read
  again from its start.
* :class:`MetricsTail`: the newest training step and loss of ``metrics.jsonl``, and when it
  last advanced (the emulator's fault trigger and stall detector).
* :func:`last_lines`: the end of a log file, for error messages.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class JsonlTail:
    """Complete new records of the JSON-lines file ``path`` (see module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self._identity: tuple[int, int] | None = None

    def poll(self) -> list[dict[str, Any]]:
        """Records completed since the last poll, in file order; [] while the file is absent."""
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                identity = (stat.st_dev, stat.st_ino)
                if identity != self._identity or stat.st_size < self.offset:
                    self._identity, self.offset = identity, 0  # a new or truncated file
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        records = []
        for line in data[: end + 1].splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


class MetricsTail(JsonlTail):
    """Follows ``metrics.jsonl``: the newest step and loss, and when it last advanced.

    Attributes:
      last_step: step of the newest training record (one with ``loss``); 0 before any.
      last_loss: its loss, or None before any.
      last_change: ``time.monotonic()`` of the last poll that saw a training record (or of
        construction, or of the caller's reset).
    """

    def __init__(self, path: Path):
        super().__init__(path)
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
