"""The trainer's numeric environment knobs, each checked where it is read: a value that is not a
number in its range is a :class:`KnobError`, one line naming the variable, never a ``ValueError``
traceback of ``int()``. ``python -m training run`` (and ``bench shardings``) check every knob first
(:func:`problem`) and exit with ``EXIT_CONFIG``, before anything starts.

The emulator and the tests set them; real VMs use the defaults, which each reader passes
(:mod:`training.agreement`, :mod:`training.cluster`, :mod:`training.preemption`). An unset or
blank variable takes the default. The trainer imports nothing of ``infra/``; this is the twin, for
the trainer's own variables, of ``infra/readers/environment.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from training.redaction import redacted

#: The longest wait any knob may set: a day. Longer is a mistake (a value in milliseconds), and
#: the coordination service's timeouts are milliseconds in a 64-bit integer either way.
MAX_SECONDS = 86_400


@dataclass(frozen=True)
class Knob:
    """A knob's range, both ends allowed, and whether it takes a fraction."""

    low: int
    high: int
    fraction: bool = False
    unit: str = "seconds"


#: Every knob, by its variable.
KNOBS: dict[str, Knob] = {
    "MULTISLICE_AGREEMENT_TIMEOUT_S": Knob(1, MAX_SECONDS),  # training.agreement
    "MULTISLICE_COORDINATOR_PORT": Knob(1, 65_535, unit="port"),  # training.cluster
    "MULTISLICE_INIT_TIMEOUT_S": Knob(1, MAX_SECONDS),  # training.cluster.initialize
    "MULTISLICE_HEARTBEAT_TIMEOUT_S": Knob(1, MAX_SECONDS),  # training.cluster.initialize
    "MULTISLICE_PREEMPTION_GRACE_S": Knob(1, MAX_SECONDS, fraction=True),  # training.preemption
    "MULTISLICE_STANDBY_WAIT_S": Knob(0, MAX_SECONDS, fraction=True),  # training.standby_handoff
    "MULTISLICE_STANDBY_ANSWER_S": Knob(1, MAX_SECONDS, fraction=True),  # training.standby_handoff
}


class KnobError(ValueError):
    """A knob's value that is not a number in its range; the message names the variable."""


def integer(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """Knob ``name`` (a whole-number one of :data:`KNOBS`) in ``environ`` (default: this process's
    environment), or ``default`` when it is unset or blank.

    Raises:
      KnobError: not a whole number within the knob's range.
    """
    found = _parsed(name, environ)
    return default if found is None else int(found)


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Knob ``name`` (one of :data:`KNOBS` that takes a fraction) in ``environ``, or ``default``.

    Raises:
      KnobError: not a finite number within the knob's range.
    """
    found = _parsed(name, environ)
    return default if found is None else float(found)


def _parsed(name: str, environ: Mapping[str, str] | None) -> float | None:
    knob = KNOBS[name]
    text = (os.environ if environ is None else environ).get(name)
    if text is None or not text.strip():
        return None
    try:
        number: float = float(text) if knob.fraction else int(text)
    except ValueError:  # also an integer past Python's 4,300 digits
        number = math.nan
    if not knob.low <= number <= knob.high:  # NaN is in no range
        kind = "a number" if knob.fraction else "a whole number"
        what = f"a port: {kind} from" if knob.unit == "port" else f"{kind} of seconds from"
        shown = redacted(text)  # a variable is at most 128 KiB (execve(2)); shown cut, without a token it holds
        shown = shown if len(shown) <= 40 else f"{shown[:40]}…"
        raise KnobError(f"{name}={shown!r} is not {what} {knob.low} to {knob.high:,}; unset it for the default")
    return number


#: The levels ``MULTISLICE_LOG_LEVEL`` may name (Python's logging; the CLI takes the same:
#: infra/readers/environment.py).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(environ: Mapping[str, str] | None = None) -> str:
    """``MULTISLICE_LOG_LEVEL`` (default ``INFO``).

    Raises:
      KnobError: it names no level of :data:`LOG_LEVELS` (``debug`` too: the levels are upper case).
    """
    text = (os.environ if environ is None else environ).get("MULTISLICE_LOG_LEVEL", "")
    if not text:
        return "INFO"
    if text not in LOG_LEVELS:
        shown = redacted(text)
        shown = shown if len(shown) <= 40 else f"{shown[:40]}…"
        hint = f" (did you mean {text.strip().upper()}?)" if text.strip().upper() in LOG_LEVELS else ""
        raise KnobError(
            f"MULTISLICE_LOG_LEVEL={shown!r} is not a log level{hint}; allowed: {', '.join(LOG_LEVELS)} (unset: INFO)"
        )
    return text


def problem(environ: Mapping[str, str] | None = None) -> str | None:
    """The first knob of :data:`KNOBS`, or ``MULTISLICE_LOG_LEVEL``, set to a value it refuses, as
    :class:`KnobError`'s line; None when every one is unset or in range."""
    try:
        log_level(environ)
        for name in KNOBS:
            _parsed(name, environ)
    except KnobError as err:
        return str(err)
    return None
