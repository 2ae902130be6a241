"""One trainer log line as ``multislice logs`` prints it, and the ``--since`` argument.

Both sources print the same format, one line per log line::

    [slice S worker W] <the line as the trainer wrote it>

(the prefix the VM's console already carries; a line that carries it is not prefixed twice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

#: ``[slice S worker W] `` at the start of a console line (boot.sh, trainer.sh and the log
#: shipper write it; ``?`` before the boot has read the metadata).
PREFIX = re.compile(r"^\[slice (\d+|\?) worker (\d+|\?)\] ")

#: ``--since`` durations: a number and a unit (s, m, h, d).
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class SinceError(ValueError):
    """A ``--since`` value that is neither a duration nor an RFC 3339 time (one line)."""


@dataclass(frozen=True)
class LogLine:
    """One line of one worker.

    Attributes:
      slice_id, worker: the VM that wrote it.
      text: the line without its ``[slice S worker W]`` prefix and line end.
      time: when it was written (UTC; a local console line carries the time of the last
        timestamp before it, see :mod:`infra.logs.local`), or None if unknown.
    """

    slice_id: int
    worker: int
    text: str
    time: datetime | None = None

    def render(self) -> str:
        return f"[slice {self.slice_id} worker {self.worker}] {self.text}"


#: Notices libraries print on the console, not the trainer: gloo's connection lines (also
#: when two processes' lines interleave mid-line) and glog-format INFO lines of the C++
#: libraries (tensorstore's ``Using GOOGLE_AUTH_TOKEN_FOR_TESTING``, XLA's). Their warnings
#: and errors (``W``/``E``/``F`` glog lines) are not notices: they stay.
_LIBRARY_NOTICE = re.compile(
    r"^(?:\[Gloo\] |I\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] )"
    r"|(?:\[Gloo\] Rank|peer ranks\. Expected number of connected peer ranks)"
)


def is_library_notice(text: str) -> bool:
    """True for a line (without its prefix) that a library printed as a notice (see
    :data:`_LIBRARY_NOTICE`): what the logs commands leave out unless ``--libraries``."""
    return bool(_LIBRARY_NOTICE.search(text))


#: What is left on a line of its own when two threads write gloo's notice at once: its last
#: number (``… Expected number of connected peer ranks is : `` of one, the other's whole line,
#: then the first one's ``7`` and line end).
_NOTICE_TAIL = re.compile(r"^\s*\d+\s*$")


class LibraryNotices:
    """Which lines of a stream of :class:`LogLine` are library notices: :func:`is_library_notice`,
    or a line of only a number right after a notice of the same worker (the tail of a notice that
    another thread's notice was written into). Keeps the last verdict per worker."""

    def __init__(self) -> None:
        self._after_notice: dict[tuple[int, int], bool] = {}

    def leaves_out(self, line: LogLine) -> bool:
        worker = (line.slice_id, line.worker)
        notice = is_library_notice(line.text) or (
            self._after_notice.get(worker, False) and bool(_NOTICE_TAIL.fullmatch(line.text))
        )
        self._after_notice[worker] = notice
        return notice

    def without_notices(self, lines: list[LogLine]) -> list[LogLine]:
        """``lines`` without the notices; a line of another writer that a gloo notice was written
        into (``… step 10/120[Gloo] Rank 0 is connected …``) is kept, cut where the notice starts."""
        kept = []
        for line in lines:
            start = line.text.find("[Gloo] ")
            if start > 0 and line.text[:start].strip() and not is_library_notice(line.text[:start]):
                self._after_notice[(line.slice_id, line.worker)] = True
                kept.append(replace(line, text=line.text[:start].rstrip()))
            elif not self.leaves_out(line):
                kept.append(line)
        return kept


def strip_prefix(line: str) -> str:
    """``line`` without a leading ``[slice S worker W] ``."""
    return PREFIX.sub("", line, count=1)


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """The UTC time ``--since`` names: a duration back from ``now`` (``90s``, ``10m``, ``2h``,
    ``1d``) or an RFC 3339 time (``2026-11-30T17:00:00Z``, ``2026-11-30T18:00:00+01:00``;
    https://www.rfc-editor.org/rfc/rfc3339#section-5.6).

    Raises:
      SinceError: anything else, or a time without a UTC offset.
    """
    text = value.strip()
    now = now or datetime.now(UTC)
    match = _DURATION.fullmatch(text)
    if match:
        return now - timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}… ({len(value):,} characters)"
    if moment is None or "T" not in text.upper():
        raise SinceError(
            f"--since {shown} is neither a duration (30s, 10m, 2h, 1d) nor an RFC 3339 time (2026-11-30T17:00:00Z)"
        )
    if moment.tzinfo is None:
        raise SinceError(f"--since {shown} has no UTC offset: end it with Z or +HH:MM (RFC 3339)")
    return moment.astimezone(UTC)
