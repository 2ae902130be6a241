"""What a run records: JSON-lines records (``metrics``, ``events``) and TensorBoard scalars.

Process 0 writes them; everyone may read them (the local emulator follows them to inject
faults at a given step and to summarize a run).

Records are buffered in memory and :meth:`RecordLog.sync` writes the window since the last
sync as one new object, ``<run>/<name>/<n>.jsonl`` (``n`` continues after the objects
already there, so the records of earlier attempts stay in front). Nothing is rewritten: a
sync costs the bytes of its own window however long the run is (an object cannot be
appended to, so a single growing file would be uploaded whole on every sync). The trainer
syncs every ``log_every_steps``, at each checkpoint and at exit; a killed process loses only
its unsynced window, steps that are recomputed from the last checkpoint anyway.

TensorBoard event files (tensorboardX) are written to a local spool; :meth:`TensorBoardLog.
sync` closes the current file, uploads it once to ``<run>/tensorboard/`` and starts the
next one, for the same reason. The spool (a temporary directory) lives from a window's first
scalar to the sync that uploads it (a failed upload keeps it for the next window's sync), and a
start that ends in an error discards it (:meth:`TensorBoardLog.discard`): only a process killed
between syncs leaves one behind.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.run_objects import json_record

if TYPE_CHECKING:  # etils.epath (unittest.mock, asyncio): some 50 ms a reader of records (`status`) does without
    from training.run_dir import RunDir


def segments(run_dir: RunDir, name: str) -> list[str]:
    """The objects of log ``name``, oldest first (names relative to the run directory)."""
    return run_dir.list(f"{name}/*.jsonl")


def parse_records(data: bytes) -> list[dict[str, Any]]:
    """The JSON-object lines of ``data``; other lines are skipped."""
    records = []
    for line in data.splitlines():
        try:
            record = json_record(line)
        except ValueError:  # not UTF-8 JSON, nested too deep, an integer too long
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_records(run_dir: RunDir, name: str) -> list[dict[str, Any]]:
    """Every record of log ``name``, in the order written; [] if there is none."""
    return [r for segment in segments(run_dir, name) for r in parse_records(run_dir.read(segment) or b"")]


class RecordLog:
    """An append-only JSON-lines log ``<run>/<name>/`` (see the module docstring).

    Args:
      enabled: False on every process but 0: appends are ignored.
    """

    def __init__(self, run_dir: RunDir, name: str, enabled: bool = True):
        self.run_dir, self.name, self.enabled = run_dir, name, enabled
        self._lines: list[str] = []
        existing = segments(run_dir, name) if enabled else []
        self._next = int(Path(existing[-1]).stem) + 1 if existing else 0

    def append(self, record: dict[str, Any]) -> None:
        if self.enabled:
            self._lines.append(json.dumps(record, sort_keys=True) + "\n")

    def sync(self) -> int:
        """Write the records appended since the last sync as one object; its size in bytes."""
        if not self._lines:
            return 0
        data = "".join(self._lines).encode()
        self.run_dir.write(f"{self.name}/{self._next:08d}.jsonl", data)
        self._next += 1
        self._lines = []
        return len(data)

    close = sync


class TensorBoardLog:
    """TensorBoard scalars under ``<run>/tensorboard`` (tensorboardX event files).

    The first file of each start has ``purge_step`` = the step it resumed from, so
    TensorBoard drops the steps a restart recomputes instead of drawing them twice.

    Args:
      start_step: the step this start resumes from.
      enabled: False on every process but 0.
    """

    def __init__(self, run_dir: RunDir, start_step: int, enabled: bool = True):
        self.run_dir, self.enabled = run_dir, enabled
        self._purge_step: int | None = start_step
        self._writer = None
        self._files = 0
        self._spool: Path | None = None  # a temporary directory while a file is open or unsent

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self._writer is None:
            from tensorboardX import SummaryWriter

            # tensorboardX names a file events.out.tfevents.<whole seconds>.<host><suffix>; two
            # starts of one run can open their first file in the same second (a crash and an
            # in-process restart do), and the later would replace the earlier's upload. The
            # suffix (the time in nanoseconds, then this start's file count) keeps every file's
            # name unique and sorted in the order written, which is the order TensorBoard
            # reads them in and applies each start's purge_step.
            self._files += 1
            suffix = f".{time.time_ns():020d}.{self._files:06d}"
            if self._spool is None:
                self._spool = Path(tempfile.mkdtemp(prefix="tensorboard-"))
            self._writer = SummaryWriter(str(self._spool), purge_step=self._purge_step, filename_suffix=suffix)
            self._purge_step = None
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def sync(self) -> None:
        """Close the current event file and upload it (nothing if no scalar came since)."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        assert self._spool is not None  # made for the writer
        for path in sorted(self._spool.iterdir()):  # a file a failed upload left goes now
            self.run_dir.write(f"tensorboard/{path.name}", path.read_bytes())
            path.unlink()
        self._spool.rmdir()
        self._spool = None

    close = sync

    def discard(self) -> None:
        """Close the current event file and remove the spool, uploading nothing: what a start
        that ended in an error had not synced (its metrics window is lost alike, and the restart
        recomputes those steps)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None
