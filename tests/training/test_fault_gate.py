"""training.fault_gate: the emulation's trainers wait at a fault's step until the emulator strikes."""

from __future__ import annotations

import threading
import time

import pytest

from training import fault_gate
from training.fault_gate import FaultGate


def test_off_unless_the_emulator_sets_both_variables(tmp_path):
    assert FaultGate.from_env({}).holds(5) is False
    assert FaultGate.from_env({fault_gate.DIR_ENV: str(tmp_path)}).holds(5) is False
    assert FaultGate.from_env({fault_gate.STEPS_ENV: "5"}).holds(5) is False
    gate = FaultGate.from_env({fault_gate.DIR_ENV: str(tmp_path), fault_gate.STEPS_ENV: "5,14"})
    assert [step for step in range(20) if gate.holds(step)] == [5, 14]
    with pytest.raises(ValueError, match="MULTISLICE_FAULT_STEPS='5,x' is not a comma-separated list"):
        FaultGate.from_env({fault_gate.DIR_ENV: str(tmp_path), fault_gate.STEPS_ENV: "5,x"})


def test_the_trainer_goes_on_only_once_the_gate_is_opened(tmp_path):
    gate = FaultGate(tmp_path / "gate", frozenset({5}))
    went_on = threading.Event()
    waiter = threading.Thread(target=lambda: gate.wait(5) and went_on.set())
    waiter.start()
    assert not went_on.wait(0.3)  # shut: it waits (the event, not a duration, lets it go)
    fault_gate.open_gate(tmp_path / "gate", 5)
    waiter.join(timeout=60)
    assert went_on.is_set()


def test_a_notice_or_the_bound_ends_the_wait(tmp_path):
    gate = FaultGate(tmp_path, frozenset({5}), wait_s=600)
    assert gate.wait(5, stop=lambda: True) is False  # a preemption notice reached the process
    started = time.monotonic()
    assert FaultGate(tmp_path, frozenset({5}), wait_s=0.05).wait(5) is False  # a gone emulator
    assert time.monotonic() - started < 60
