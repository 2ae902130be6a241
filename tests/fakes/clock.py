"""A virtual clock for tests of bounded waits: ``time.monotonic`` and ``time.sleep`` patched
(this project's polling and ``google.api_core.retry`` both read them from the ``time`` module),
so a 30-minute deadline is checked exactly and without waiting. Sleeps advance the clock at
once; from several threads they add up (a conservative bound).
"""

from __future__ import annotations

import threading
import time

import pytest


class FakeClock:
    """``monotonic()`` returns :attr:`now`; ``sleep(s)`` records ``s`` and advances :attr:`now`."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The virtual clock, patched into ``time`` for the test."""
    fake = FakeClock()
    monkeypatch.setattr(time, "monotonic", fake.monotonic)
    monkeypatch.setattr(time, "sleep", fake.sleep)
    return fake
