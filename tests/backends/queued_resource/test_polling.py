"""The one bounded wait (infra/backends/queued_resource/provider/polling.py).

Most cases run on a fake clock (``time.monotonic`` and ``time.sleep`` patched for the test, as
both this module and ``google.api_core.retry`` read them), so the schedule and the deadline
are checked exactly and without waiting.
"""

from __future__ import annotations

import pytest

from infra.backends.queued_resource.provider.polling import Deadline, Polled, PollSchedule, duration_text, poll_until
from tests.fakes.clock import FakeClock, clock  # noqa: F401 (clock: fixture)


class Observations:
    """Returns the given states in turn (the last one sticks); records when it was called."""

    def __init__(self, clock: FakeClock, *states: str) -> None:
        self.clock, self.states, self.times = clock, list(states), []

    def __call__(self) -> str:
        if len(self.times) > 1000:  # a wait that ignored its deadline fails here instead of hanging
            raise AssertionError("polled past the deadline")
        self.times.append(self.clock.now - 1000.0)
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_the_schedule_grows_by_its_multiplier_up_to_its_maximum():
    delays = PollSchedule(first=2, maximum=10, multiplier=1.5).delays()
    assert [next(delays) for _ in range(7)] == [2, 3, 4.5, 6.75, 10, 10, 10]


@pytest.mark.parametrize("first, maximum, multiplier", [(-1, 10, 1.5), (5, 2, 1.5), (1, 10, 0.5)])
def test_a_schedule_that_cannot_work_is_rejected(first, maximum, multiplier):
    with pytest.raises(ValueError, match="poll schedule needs"):
        PollSchedule(first=first, maximum=maximum, multiplier=multiplier)


def test_it_stops_before_a_delay_would_pass_the_deadline(clock):
    observe = Observations(clock, "WAITING_FOR_RESOURCES")
    polled = poll_until(observe, done=lambda s: s == "ACTIVE", timeout=10, schedule=PollSchedule(1, 4, 2))
    # Polls at 0, then after sleeping 1, 2 and 4 s: at 1, 3 and 7; the next 4 s would end at
    # 11, past the 10 s deadline, so it returns at 7 with the last observation, not done.
    assert observe.times == [0, 1, 3, 7]
    assert clock.sleeps == [1, 2, 4]
    assert polled == Polled("WAITING_FOR_RESOURCES", False, 7)


def test_it_returns_the_first_done_observation(clock):
    observe = Observations(clock, "CREATING", "PROVISIONING", "ACTIVE", "never read")
    polled = poll_until(observe, done=lambda s: s == "ACTIVE", timeout=100, schedule=PollSchedule(1, 4, 2))
    assert polled == Polled("ACTIVE", True, 3)
    assert observe.times == [0, 1, 3]


def test_a_zero_timeout_still_observes_once(clock):
    observe = Observations(clock, "ACCEPTED")
    assert poll_until(observe, done=lambda s: False, timeout=0, schedule=PollSchedule(1, 4)) == Polled(
        "ACCEPTED", False, 0
    )


def test_progress_is_stated_on_each_new_state_and_again_after_report_every(clock):
    states = ["CREATING"] + ["WAITING_FOR_RESOURCES"] * 6 + ["ACTIVE"]
    reports: list[tuple[str, float]] = []
    polled = poll_until(
        Observations(clock, *states),
        done=lambda s: s == "ACTIVE",
        timeout=100,
        schedule=PollSchedule(2, 2),
        state=lambda s: s,
        report=lambda state, elapsed: reports.append((state, elapsed)),
        report_every=5,
    )
    # Polls every 2 s: CREATING at 0, WAITING at 2..12, ACTIVE at 14. WAITING is stated when it
    # starts (2), then once 5 s have passed since: at 8 (not 4 or 6), and not at 10 or 12.
    assert reports == [("CREATING", 0), ("WAITING_FOR_RESOURCES", 2), ("WAITING_FOR_RESOURCES", 8), ("ACTIVE", 14)]
    assert polled.done and polled.elapsed == 14


def test_observations_without_a_state_are_not_stated(clock):
    reports: list[str] = []
    poll_until(
        Observations(clock, "a", "error", "b"),
        done=lambda s: s == "b",
        timeout=100,
        schedule=PollSchedule(1, 1),
        state=lambda s: None if s == "error" else s,
        report=lambda state, _elapsed: reports.append(state),
    )
    assert reports == ["a", "b"]


def test_an_error_of_observe_propagates_unchanged(clock):
    def observe() -> str:
        raise ConnectionError("gone away")

    with pytest.raises(ConnectionError, match="gone away"):
        poll_until(observe, done=lambda s: True, timeout=100, schedule=PollSchedule(1, 1))
    assert clock.sleeps == []


def test_it_is_bounded_on_the_real_clock():
    calls = []

    def observe() -> int:
        calls.append(None)
        if len(calls) > 100:  # a wait that ignored its deadline fails here instead of hanging
            raise AssertionError("polled past the deadline")
        return len(calls)

    polled = poll_until(observe, done=lambda _n: False, timeout=0.05, schedule=PollSchedule(0.01, 1.0, 1.5))
    # Sleeps of 0.01 + 0.015 + 0.0225 fit in 0.05 s, adding 0.03375 would not: at most 4 polls.
    assert not polled.done and polled.value == len(calls) and 1 <= len(calls) <= 4


def test_operation_polling_follows_the_schedule_and_gives_up_after_its_timeout():
    polling = PollSchedule(0.5, 8, 1.5).operation_polling(42.0)
    assert polling.timeout == 42.0
    assert "initial=0.5, maximum=8.0, multiplier=1.5" in str(polling)  # Retry.__str__ shows its delays


def test_a_deadline_counts_down_from_its_creation_and_never_below_zero(clock):
    deadline = Deadline(100)
    clock.sleep(30)
    assert (deadline.elapsed(), deadline.remaining(), deadline.expired()) == (30, 70, False)
    clock.sleep(80)
    assert (deadline.elapsed(), deadline.remaining(), deadline.expired()) == (110, 0, True)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (42.9, "42s"), (60, "1m00s"), (187, "3m07s"), (3600, "60m00s")])
def test_durations_read_as_minutes_and_seconds(seconds, text):
    assert duration_text(seconds) == text
