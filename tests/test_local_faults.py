"""infra.local.faults: ``--kill`` / ``--preempt`` specs ``SLICE@STEP`` and their limits."""

from __future__ import annotations

import pytest

from infra.local.faults import Fault, FaultSpecError, parse_fault


@pytest.mark.parametrize(
    ("spec", "slice_id", "step"),
    [("1@40", 1, 40), ("0@1", 0, 1), (" 2 @ 99 ", 2, 99), ("0@007", 0, 7)],
)
def test_valid_specs(spec, slice_id, step):
    fault = parse_fault("kill", spec, slices=3, total_steps=100)
    assert fault == Fault("kill", slice_id, step)
    assert str(fault) == f"kill slice {slice_id} at step {step}"


def test_the_kind_is_kept():
    assert parse_fault("preempt", "1@5", slices=2, total_steps=10).kind == "preempt"


@pytest.mark.parametrize("spec", ["1", "@4", "1@", "1@2@3", "a@3", "-1@3", "1@-3", "1.0@3", "1@3x", ""])
def test_malformed_specs_name_the_option_and_the_shape(spec):
    with pytest.raises(FaultSpecError) as err:
        parse_fault("preempt", spec, slices=2, total_steps=10)
    assert str(err.value) == f"--preempt {spec!r}: expected SLICE@STEP, e.g. --preempt 1@40"


@pytest.mark.parametrize("spec", ["１@3", "1@３", "٣@2", "1@²"])
def test_only_ascii_digits(spec):
    # str.isdigit() and int() accept these (fullwidth, Arabic-Indic, superscript digits);
    # a spec is a command-line value and takes ASCII digits only.
    with pytest.raises(FaultSpecError, match="expected SLICE@STEP"):
        parse_fault("kill", spec, slices=10, total_steps=10)


@pytest.mark.parametrize("slices", [1, 2, 5])
def test_slice_out_of_range(slices):
    with pytest.raises(FaultSpecError) as err:
        parse_fault("kill", f"{slices}@3", slices=slices, total_steps=10)
    assert str(err.value) == f"--kill '{slices}@3': slice {slices} does not exist (slices 0..{slices - 1})"
    assert parse_fault("kill", f"{slices - 1}@3", slices=slices, total_steps=10).slice_id == slices - 1


@pytest.mark.parametrize("step", [0, 10, 11, 10**6])
def test_step_outside_the_run(step):
    # A fault fires once training reports a step ≥ STEP; at or after the last step (10) it
    # could never fire, and step 0 is before any step.
    with pytest.raises(FaultSpecError) as err:
        parse_fault("kill", f"0@{step}", slices=1, total_steps=10)
    assert str(err.value) == f"--kill '0@{step}': step must be between 1 and 9 (the run has 10 steps)"


def test_the_last_step_that_can_fire():
    assert parse_fault("kill", "0@9", slices=1, total_steps=10).step == 9
