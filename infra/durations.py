"""Durations as a stack file writes them (``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"``
or a number of seconds): the parser every duration key of a stack shares (``multislice:
queuedResource.createTimeout``, ``multislice:computeEngine.maxRunDuration``, …).

It sits below :mod:`infra.config` and the backends' settings (:mod:`infra.backends`), which both
read durations."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_DURATION = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")


def parse_duration(value: Any) -> int:
    """Seconds in a duration written ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"`` or as a
    number of seconds.

    Raises:
      ValueError: anything else (pydantic turns it into a key-path error line).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write e.g. '90s', '30m', '2h', '1d'")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = int(value.strip())
    elif isinstance(value, str) and value.strip() and (m := _DURATION.match(value.strip())):
        seconds = int(m["d"] or 0) * 86400 + int(m["h"] or 0) * 3600 + int(m["m"] or 0) * 60 + int(m["s"] or 0)
    else:
        raise ValueError(f"{value!r} is not a duration; write e.g. '90s', '30m', '2h', '1d' or seconds")
    if seconds <= 0:
        raise ValueError(f"{value!r}: the duration must be positive")
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
