"""Times of day as ``multislice status`` and ``local up`` print them."""

from __future__ import annotations

from datetime import datetime


def clock(moment: float | None) -> str:
    """A local time of day (with the date when not today), ``-`` when unknown."""
    if moment is None:
        return "-"
    when = datetime.fromtimestamp(moment)
    return when.strftime("%H:%M:%S") if when.date() == datetime.now().date() else when.strftime("%Y-%m-%d %H:%M:%S")
