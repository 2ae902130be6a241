"""Durations as a stack file writes them (``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"``
or a number of seconds): the parser every duration key of a stack shares (``multislice:
queuedResource.createTimeout``, ``multislice:computeEngine.maxRunDuration``, …).

It sits below :mod:`infra.config` and the backends' settings (:mod:`infra.backends`), which both
read durations."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION = re.compile(r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")
#: The longest duration any key takes, seconds: 315,576,000,000, the largest value of a protobuf
#: ``google.protobuf.Duration`` ("Range is approximately +-10,000 years": its
#: ``duration.proto``), in which the Google APIs take durations (``validUntil`` becomes the TPU API's
#: ``QueueingPolicy.validUntilDuration``). Keys with their own bounds check them after this one.
MAX_DURATION_S = 315_576_000_000
#: The most digits a duration's number may have (more cannot be under :data:`MAX_DURATION_S`); longer
#: text is refused before Python converts it (``int()`` refuses over 4,300 digits with its own error).
_MAX_DIGITS = len(str(MAX_DURATION_S))


def parse_duration(value: Any) -> int:
    """Seconds in a duration written ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"`` or as a
    number of seconds.

    Raises:
      ValueError: anything else, or more than :data:`MAX_DURATION_S` (pydantic turns it into a
        key-path error line).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write e.g. '90s', '30m', '2h', '1d'")
    text = value.strip() if isinstance(value, str) else ""
    if isinstance(value, str) and any(len(run) > _MAX_DIGITS for run in re.findall(r"\d+", text)):
        raise ValueError(f"{text[:20]!r}…: longer than the longest duration, {MAX_DURATION_S} s (about 10,000 years)")
    if isinstance(value, int):
        seconds = value
    elif text.isdigit() and text.isascii():
        seconds = int(text)
    elif text and text.isascii() and (m := _DURATION.fullmatch(text)):
        seconds = int(m["d"] or 0) * 86400 + int(m["h"] or 0) * 3600 + int(m["m"] or 0) * 60 + int(m["s"] or 0)
    else:
        raise ValueError(f"{str(value)[:40]!r} is not a duration; write e.g. '90s', '30m', '2h', '1d' or seconds")
    if seconds <= 0:
        raise ValueError(f"{str(value)[:40]!r}: the duration must be positive")
    if seconds > MAX_DURATION_S:
        raise ValueError(
            f"{str(value)[:20]}…: longer than the longest duration, {MAX_DURATION_S} s (about 10,000 years; the "
            "largest protobuf Duration, in which Google's APIs take durations)"
        )
    return seconds


#: A positive duration in whole seconds, written as seconds or ``"30m"``-style text.
Duration = Annotated[int, BeforeValidator(parse_duration)]


def format_duration(seconds: int) -> str:
    """``seconds`` in the largest whole unit of d, h, m (else s): 259200 -> ``3d``, the way a stack
    file writes it (the inverse of :func:`parse_duration` for whole units)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
