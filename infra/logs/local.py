"""The trainer log lines of a local emulation: each emulated VM's console log.

``multislice local up`` appends each VM's console output to
``<state>/<stack>/logs/slice-S-worker-W.log`` (:class:`infra.emulated.state.LocalPaths`,
:mod:`infra.emulated.vm`): a ``===== boot N of slice S worker W at <RFC 3339 time> =====`` line
per boot, then the boot's and the trainer's lines, most of them prefixed
``[slice S worker W]``. A console line has no time of its own; a line counts as written at
the newest time stated at or before it in its file: the boot line's, or that of a trainer
log line (``2026-11-30T17:31:41+0000 INFO ...``, training/__main__.py).

:class:`ConsoleTail` reads every VM's log and, polled again, what was appended since (a log
that was removed or truncated, by ``local up --fresh``, is read again from its start). A log is
read only as a regular file (a FIFO or a device in its place is a :class:`ConsoleLogError`), and at
most :data:`MAX_POLL_BYTES` of it a poll.
"""

from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from infra.logs.lines import LogLine, strip_prefix
from infra.readers.files import UnreadableFile, open_regular

#: The most of one VM's console log read in one poll: some 200,000 lines of 160 bytes. A log with more
#: unread (the first poll of a long run's log) is read from this far before its end, the newest lines,
#: and a line says how much was skipped: memory is bounded by the number of VMs, not their logs' length.
MAX_POLL_BYTES = 32 << 20


class ConsoleLogError(OSError):
    """A console log that is there but cannot be read (a FIFO or a device in its place, or the OS's
    refusal); the message names it."""


#: The console log of one emulated VM.
VM_LOG = re.compile(r"^slice-(\d+)-worker-(\d+)\.log$")
#: Times a console line may state: the boot line's, and the trainer's log format.
_BOOT_TIME = re.compile(r"^===== boot \d+ of .* at (\S+) =====$")
_TRAINER_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:Z|[+-]\d{2}:?\d{2})) ")


def stated_time(text: str) -> datetime | None:
    """The UTC time a console line (without its prefix) states, if any."""
    match = _BOOT_TIME.fullmatch(text) or _TRAINER_TIME.match(text)
    if not match:
        return None
    try:
        moment = datetime.fromisoformat(match[1].replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo else None


def vm_logs(logs_dir: Path) -> dict[tuple[int, int], Path]:
    """``(slice, worker) → console log`` of every VM that has one, sorted."""
    found = {}
    if logs_dir.is_dir():
        for path in logs_dir.iterdir():
            match = VM_LOG.fullmatch(path.name)
            if match:
                found[(int(match[1]), int(match[2]))] = path
    return dict(sorted(found.items()))


def _read_to(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the open file ``fd`` (fewer if it is shorter now)."""
    chunks, offset = [], start
    while offset < end and (chunk := os.pread(fd, min(end - offset, 1 << 20), offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


@dataclass
class _Position:
    inode: int = -1
    offset: int = 0
    time: datetime | None = None
    pending: bytes = b""


@dataclass
class ConsoleTail:
    """The lines of the VMs' console logs in ``logs_dir``, poll by poll.

    Args:
      slice_id, worker: only this slice / worker number (None: all).
      since: only lines written at or after this time (lines of unknown time are left out).
    """

    logs_dir: Path
    slice_id: int | None = None
    worker: int | None = None
    since: datetime | None = None
    _positions: dict[tuple[int, int], _Position] = field(default_factory=dict)

    def poll(self, final: bool = False) -> list[LogLine]:
        """The lines appended since the last poll (everything, the first time), merged across
        VMs by time (each VM's own order kept). A last line without its line end waits for
        the next poll unless ``final``."""
        streams = []
        for (slice_id, worker), path in vm_logs(self.logs_dir).items():
            if (self.slice_id is None or slice_id == self.slice_id) and (self.worker is None or worker == self.worker):
                streams.append(self._read(slice_id, worker, path, final))
        merged = heapq.merge(*streams, key=lambda line: line.time or datetime.min.replace(tzinfo=UTC))
        return [line for line in merged if self.since is None or (line.time is not None and line.time >= self.since)]

    def _read(self, slice_id: int, worker: int, path: Path, final: bool) -> list[LogLine]:
        position = self._positions.setdefault((slice_id, worker), _Position())
        try:
            fd = open_regular(path)  # a FIFO would block the open, a device never ends
        except (FileNotFoundError, NotADirectoryError):
            return []
        except UnreadableFile as err:
            raise ConsoleLogError(f"cannot read the console log {path}: {err.why}") from None
        try:
            stat = os.fstat(fd)
            if stat.st_ino != position.inode or stat.st_size < position.offset:  # new or truncated: from the start
                self._positions[(slice_id, worker)] = position = _Position(inode=stat.st_ino)
            start = max(position.offset, stat.st_size - MAX_POLL_BYTES)
            skipped, new = start - position.offset, _read_to(fd, start, stat.st_size)
        except OSError as err:
            raise ConsoleLogError(f"cannot read the console log {path}: {err.strerror or err}") from None
        finally:
            os.close(fd)
        position.offset = start + len(new)
        lines: list[LogLine] = []
        if skipped:  # the newest MAX_POLL_BYTES, from the first line that begins in them
            cut = new.find(b"\n") + 1
            skipped, new, position.pending = skipped + len(position.pending) + cut, new[cut:], b""
            note = f"({skipped:,} earlier bytes of {path.name} not shown: over {MAX_POLL_BYTES:,} unread at once)"
            lines.append(LogLine(slice_id, worker, note, position.time))
        data = position.pending + new
        *complete, rest = data.split(b"\n")
        position.pending = rest
        if final and rest:
            complete.append(rest)
            position.pending = b""
        for raw in complete:
            text = strip_prefix(raw.decode("utf-8", errors="replace").rstrip("\r"))
            position.time = stated_time(text) or position.time
            lines.append(LogLine(slice_id, worker, text, position.time))
        return lines
