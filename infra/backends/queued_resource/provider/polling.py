"""Bounded waits: poll an observation until it is done or a deadline passes, stating progress.

Every wait of the provider (for a state after create, update or reset; for a deleted queued
resource to be gone) is one :func:`poll_until` call, and every long-running operation is
polled by ``google.api_core`` with :meth:`PollSchedule.operation_polling`, so one schedule
(first delay, ×:attr:`PollSchedule.multiplier` per poll, capped) governs both. The loop itself
is ``google.api_core.retry.retry_target`` (a not-yet-done observation is the "error" it
retries), with the schedule's delays and no jitter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Seconds after which an unchanged state is stated again (a heartbeat for long waits).
REPORT_EVERY_SECONDS = 60.0


def duration_text(seconds: float) -> str:
    """``42s`` or ``3m07s`` (whole seconds, truncated) for progress lines and messages."""
    value = int(seconds)
    return f"{value // 60}m{value % 60:02d}s" if value >= 60 else f"{value}s"


class Deadline:
    """One time budget shared by every step of a lifecycle call (an operation's polling, the
    state wait after it, API retries), so the steps together never exceed it.

    Args:
      seconds: the budget, from now (``time.monotonic``).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._start = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.monotonic() - self._start

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


@dataclass(frozen=True)
class PollSchedule:
    """Delays between polls, in seconds: ``first``, then ×``multiplier`` up to ``maximum``.

    Raises:
      ValueError: ``first`` is negative, ``maximum`` < ``first`` or ``multiplier`` < 1.
    """

    first: float
    maximum: float
    multiplier: float = 1.5

    def __post_init__(self) -> None:
        if not (0 <= self.first <= self.maximum and self.multiplier >= 1):
            raise ValueError(
                f"poll schedule needs 0 <= first <= maximum and multiplier >= 1; got first={self.first}, "
                f"maximum={self.maximum}, multiplier={self.multiplier}"
            )

    def delays(self) -> Iterator[float]:
        """The delays, forever: first, first×m, first×m², … capped at ``maximum``."""
        delay = self.first
        while True:
            yield delay
            delay = min(delay * self.multiplier, self.maximum)

    def operation_polling(self, timeout: float) -> Any:
        """The ``polling=`` argument of ``google.api_core.operation.Operation.result`` for this
        schedule, giving up after ``timeout`` seconds (``concurrent.futures.TimeoutError``)."""
        from google.api_core.future import polling

        return polling.DEFAULT_POLLING.with_delay(
            initial=self.first, maximum=self.maximum, multiplier=self.multiplier
        ).with_timeout(timeout)


@dataclass(frozen=True)
class Polled(Generic[T]):
    """The outcome of :func:`poll_until`: the last observation, whether it was done, and the
    seconds since the wait began."""

    value: T
    done: bool
    elapsed: float


class _NotYet(Exception):
    """An observation that is not done yet (what ``retry_target`` retries)."""


def poll_until(
    observe: Callable[[], T],
    *,
    done: Callable[[T], bool],
    timeout: float,
    schedule: PollSchedule,
    state: Callable[[T], str | None] = lambda _value: None,
    report: Callable[[str, float], None] = lambda _state, _elapsed: None,
    report_every: float = REPORT_EVERY_SECONDS,
) -> Polled[T]:
    """Call ``observe`` until ``done(observation)``, sleeping the schedule's delays between
    calls, and stop before a delay would pass ``timeout`` seconds from the start.

    After each observation whose ``state(observation)`` is not ``None``, ``report(state,
    elapsed_seconds)`` is called when the state differs from the last one reported or
    ``report_every`` seconds have passed since.

    Returns:
      ``Polled(last observation, done, elapsed)``; ``done`` is False when the deadline came
      first (``observe`` is always called at least once).

    Raises:
      whatever ``observe`` raises, unchanged.
    """
    from google.api_core import exceptions
    from google.api_core.retry import retry_target

    start = time.monotonic()
    last_state: str | None = None
    last_report = start
    last: list[T] = []

    def attempt() -> T:
        nonlocal last_state, last_report
        value = observe()
        last[:] = [value]
        now = time.monotonic()
        current = state(value)
        if current is not None and (current != last_state or now - last_report >= report_every):
            report(current, now - start)
            last_state, last_report = current, now
        if not done(value):
            raise _NotYet()
        return value

    try:
        retry_target(  # returns what the last attempt returned: last[0] (retry_target is untyped)
            attempt,
            predicate=lambda exc: isinstance(exc, _NotYet),
            sleep_generator=schedule.delays(),
            timeout=timeout,
        )
    except exceptions.RetryError as exc:
        if not isinstance(exc.cause, _NotYet):  # pragma: no cover - only _NotYet is retried
            raise
        return Polled(last[0], False, time.monotonic() - start)
    return Polled(last[0], True, time.monotonic() - start)
