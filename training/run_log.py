"""What a run records: JSON-lines files (``metrics.jsonl``, ``events.jsonl``) and TensorBoard
scalars (``tensorboard/``) in the run directory.

Process 0 writes them; everyone may read them (the local emulator reads them to inject
faults at a given step and to summarize a run).

* Local run directory: each record is appended, flushed and fsynced at once, so a killed
  process loses nothing it had written.
* ``gs://`` run directory: objects cannot be appended to. Records go to a VM-local spool
  (seeded from the existing object at start, so records of earlier attempts survive a
  slice being recreated) and the whole spool is uploaded by :meth:`JsonlLog.sync` — the
  trainer syncs at every checkpoint and at exit. A crash loses at most the records since
  the last checkpoint, which are also the steps that will be recomputed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def is_remote(path: str) -> bool:
    return "://" in path


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


class JsonlLog:
    """An append-only JSON-lines file at ``path`` (local or ``gs://``).

    Args:
      path: where the file lives.
      enabled: False on every process but 0: appends are ignored.
    """

    def __init__(self, path: str, enabled: bool = True):
        self.path = path
        self.enabled = enabled
        self._remote = is_remote(path)
        self._file = None
        if not enabled:
            return
        if self._remote:
            from etils import epath

            spool_root = Path(os.environ.get("MULTISLICE_HOME", tempfile.gettempdir())) / "spool"
            spool_root.mkdir(parents=True, exist_ok=True)
            self._spool = spool_root / path.replace("://", "_").replace("/", "_")
            remote = epath.Path(path)
            self._spool.write_bytes(remote.read_bytes() if remote.exists() else b"")
            self._file = open(self._spool, "a", encoding="utf-8")
            _end_torn_line(self._spool, self._file)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")
            _end_torn_line(Path(path), self._file)

    def append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if not self._remote:
            os.fsync(self._file.fileno())

    def sync(self) -> None:
        """Upload the spool to a remote path (no-op for local paths)."""
        if self._file is None or not self._remote:
            return
        from etils import epath

        self._file.flush()
        epath.Path(self.path).write_bytes(self._spool.read_bytes())

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None


def _end_torn_line(path: Path, handle) -> None:
    """A process killed mid-write can leave a last line without its newline; end it, so the
    next record starts on a line of its own (the torn line stays, unparseable, and readers
    skip it)."""
    size = path.stat().st_size
    if size:
        with open(path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                handle.write("\n")
                handle.flush()


class TensorBoardLog:
    """TensorBoard scalars under ``<run_dir>/tensorboard`` (tensorboardX event files).

    Each start writes a new event file with ``purge_step`` = the step it resumed from, so
    TensorBoard drops the steps a restart recomputes instead of drawing them twice. For a
    ``gs://`` run directory the event files are written to the VM-local spool and copied up
    by :meth:`sync` (tensorboardX itself would need google-cloud-storage).

    Args:
      run_dir: the run directory.
      start_step: the step this start resumes from.
      enabled: False on every process but 0.
    """

    def __init__(self, run_dir: str, start_step: int, enabled: bool = True):
        self.remote_dir = join(run_dir, "tensorboard") if is_remote(run_dir) else None
        self._writer = None
        if not enabled:
            return
        from tensorboardX import SummaryWriter

        if self.remote_dir is None:
            self.local_dir = Path(run_dir) / "tensorboard"
        else:
            spool_root = Path(os.environ.get("MULTISLICE_HOME", tempfile.gettempdir())) / "spool"
            self.local_dir = spool_root / self.remote_dir.replace("://", "_").replace("/", "_")
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(self.local_dir), purge_step=start_step, flush_secs=30)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def sync(self) -> None:
        """Flush; for a remote run directory, copy the event files up."""
        if self._writer is None:
            return
        self._writer.flush()
        if self.remote_dir is not None:
            from etils import epath

            for path in self.local_dir.iterdir():
                epath.Path(join(self.remote_dir, path.name)).write_bytes(path.read_bytes())

    def close(self) -> None:
        if self._writer is not None:
            self.sync()
            self._writer.close()
            self._writer = None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """All complete records of a JSON-lines file (a torn last line is skipped); [] if absent."""
    if is_remote(path):
        from etils import epath

        p = epath.Path(path)
        text = p.read_text() if p.exists() else ""
    else:
        p = Path(path)
        text = p.read_text() if p.exists() else ""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
