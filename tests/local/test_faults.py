"""infra.local.faults: ``--kill`` / ``--preempt`` specs ``SLICE@STEP`` and their limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
    assert str(err.value) == f"--preempt {spec!r} is malformed: the form is SLICE@STEP, e.g. --preempt 1@40"


@pytest.mark.parametrize("spec", ["１@3", "1@３", "٣@2", "1@²"])
def test_only_ascii_digits(spec):
    # str.isdigit() and int() accept these (fullwidth, Arabic-Indic, superscript digits);
    # a spec is a command-line value and takes ASCII digits only.
    with pytest.raises(FaultSpecError, match="is malformed: the form is SLICE@STEP"):
        parse_fault("kill", spec, slices=10, total_steps=10)


@pytest.mark.parametrize("slices", [1, 2, 5])
def test_slice_out_of_range(slices):
    with pytest.raises(FaultSpecError) as err:
        parse_fault("kill", f"{slices}@3", slices=slices, total_steps=10)
    which = "slice 0" if slices == 1 else f"slices 0..{slices - 1}"
    plural = "s" if slices != 1 else ""
    assert (
        str(err.value)
        == f"--kill '{slices}@3': slice {slices} does not exist: the stack has {slices} slice{plural} ({which})"
    )
    assert parse_fault("kill", f"{slices - 1}@3", slices=slices, total_steps=10).slice_id == slices - 1


@pytest.mark.parametrize("step", [0, 10, 11, 10**6])
def test_step_outside_the_run(step):
    # A fault fires once training reports a step ≥ STEP; at or after the last step (10) it
    # could never fire, and step 0 is before any step.
    with pytest.raises(FaultSpecError) as err:
        parse_fault("kill", f"0@{step}", slices=1, total_steps=10)
    assert str(err.value) == (
        f"--kill '0@{step}': step {step} is outside the run: training.steps is 10, so a fault can fire at steps 1..9"
    )


def test_the_last_step_that_can_fire():
    assert parse_fault("kill", "0@9", slices=1, total_steps=10).step == 9


# --- through `multislice local up`, in-process: refused before anything starts ----------------

EMU_STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


def emu_stack() -> tuple[int, int]:
    """The test stack's slice count and training.steps, read from its file."""
    config = yaml.safe_load(EMU_STACK.read_text())["config"]
    return config["multislice:slices"], config["multislice:training"]["steps"]


@pytest.fixture
def nothing_may_start(monkeypatch, tmp_path):
    """``multislice local up`` with its state under ``tmp_path``, where taking the run's lock
    (the first thing that touches the state) or booting the emulated queued resource fails
    the test."""
    from infra.emulated import state as local_state
    from infra.local import emulated_stack

    def started(*args, **kwargs):
        raise AssertionError("the run started despite a bad fault spec")

    monkeypatch.setattr(local_state, "acquire_lock", started)
    monkeypatch.setattr(emulated_stack.EmulatedStack, "up", started)
    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(tmp_path))
    return tmp_path


def local_up(*args: str):
    from typer.testing import CliRunner

    from infra.cli import app

    return CliRunner().invoke(app, ["local", "up", "--config-file", str(EMU_STACK), *args], env={"COLUMNS": "80"})


@pytest.mark.parametrize("kind", ["kill", "preempt"])
@pytest.mark.parametrize("extra", [0, 3])
def test_local_up_refuses_a_fault_on_a_slice_the_stack_lacks(nothing_may_start, kind, extra):
    slices, steps = emu_stack()
    spec = f"{slices + extra}@{steps // 2}"
    result = local_up(f"--{kind}", spec)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: --{kind} '{spec}': slice {slices + extra} does not exist: the stack has {slices} slices "
        f"(slices 0..{slices - 1})"
    ]
    assert list(nothing_may_start.iterdir()) == []  # no state, no bucket, no VM


@pytest.mark.parametrize("kind", ["kill", "preempt"])
def test_local_up_refuses_a_fault_beyond_the_runs_steps(nothing_may_start, kind):
    slices, steps = emu_stack()
    for step in (steps, steps + 1):
        result = local_up(f"--{kind}", f"0@{step}")
        assert result.exit_code == 2, result.output
        (line,) = result.output.splitlines()
        assert line.startswith(f"error: --{kind} '0@{step}': step {step} is outside the run: training.steps is {steps}")
    assert list(nothing_may_start.iterdir()) == []


def test_local_up_checks_every_fault_before_starting(nothing_may_start):
    """A valid --kill does not let a bad --preempt after it through."""
    slices, steps = emu_stack()
    result = local_up("--kill", f"0@{steps // 2}", "--preempt", f"{slices}@{steps // 2}")
    assert (
        result.exit_code == 2 and f"--preempt '{slices}@{steps // 2}': slice {slices} does not exist" in result.output
    )


@pytest.mark.parametrize(
    ("withhold", "says"),
    [
        (
            "1",
            "--withhold '1' is malformed: the form is SLICE:DURATION or SLICE:until-step-STEP, "
            "e.g. --withhold 1:120s or --withhold 1:until-step-80",
        ),
        ("1@120s", "--withhold '1@120s' is malformed: the form is SLICE:DURATION"),
        ("2:120s", "--withhold '2:120s': slice 2 does not exist (slices 0..1)"),
        ("0:120s", "--withhold '0:120s': no --kill or --preempt strikes slice 0, so it never loses its capacity"),
        ("1:-5s", "--withhold '1:-5s' is malformed: '-5s' is not a duration"),
        ("1:soon", "--withhold '1:soon' is malformed: 'soon' is not a duration"),
        ("1:0", "--withhold '1:0' is malformed: '0': the duration must be positive"),
        (
            "1:" + "9" * 5000,
            "--withhold '1:999999999999999999'… (5,002 characters) is malformed: '99999999999999999999'…",
        ),
        ("0:soon", "--withhold '0:soon' is malformed: 'soon' is not a duration"),  # before "no fault strikes slice 0"
        ("1:40s --withhold 01:10s", "--withhold '01:10s': slice 1 is withheld twice (also --withhold '1:40s')"),
    ],
)
def test_local_up_refuses_a_withhold_it_cannot_carry_out(nothing_may_start, withhold, says):
    slices, steps = emu_stack()
    withholds = [arg for value in withhold.split(" --withhold ") for arg in ("--withhold", value)]
    result = local_up("--kill", f"1@{steps // 2}", *withholds)
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert line.startswith(f"error: {says}"), line
    assert list(nothing_may_start.iterdir()) == []


def test_a_withhold_names_the_slice_and_its_seconds():
    from infra.local.withholds import Withhold, parse_withhold

    faults = [Fault("kill", 1, 5)]
    assert parse_withhold("1:2m", slices=2, faults=faults) == (1, Withhold(seconds=120.0))
    assert parse_withhold(" 1 : 90 ", slices=2, faults=faults) == (1, Withhold(seconds=90.0))


# --- FaultSchedule: when a fault fires, from the trainer's records alone -----------------------

from infra.local.faults import FaultSchedule  # noqa: E402


def start(step: int) -> dict:
    """The ``start`` event a trainer writes before its first step (training.train)."""
    return {"event": "start", "step": step, "restored": step > 0, "processes": 2, "devices": 8, "time": 0.0}


def trained(*steps: int) -> list[dict]:
    """Training records of ``steps`` (an eval record in between, which is no step report)."""
    return [{"step": s, "loss": 5.0 - s / 100} for s in steps] + [{"step": steps[-1], "eval_loss": 4.0}]


def kill(slice_id: int, step: int) -> Fault:
    return Fault("kill", slice_id, step)


def test_a_fault_fires_once_the_attempt_reaches_its_step():
    schedule = FaultSchedule([kill(1, 30)])
    schedule.observe([start(0)], trained(27, 28))
    assert schedule.due() is None
    schedule.observe([], trained(29, 30))
    assert schedule.due() == kill(1, 30)
    assert schedule.due() is None and schedule.pending == []


def test_steps_reported_before_any_start_do_not_count():
    # The emulation has booted but no trainer of this attempt has started: records written
    # before (none should exist, but a late window of an earlier process could) are ignored.
    schedule = FaultSchedule([kill(1, 3)])
    schedule.observe([], trained(5, 6))
    assert schedule.due() is None
    schedule.observe([start(0)], trained(3))
    assert schedule.due() == kill(1, 3)


def test_after_a_repair_only_the_next_attempt_counts():
    # A past bug: --kill 1@30 --kill 1@31 fired the second fault during the
    # reboot, on step 32 of the killed attempt.
    schedule = FaultSchedule([kill(1, 31), kill(1, 30)])
    schedule.observe([start(0)], trained(29, 30, 31, 32))
    assert schedule.due() == kill(1, 30)
    assert schedule.due() is None  # the killed attempt's step 32 no longer counts
    schedule.observe([start(30)], [])  # the repaired run resumed from the step-30 checkpoint
    assert schedule.attempt_step == 30 and schedule.due() is None
    schedule.observe([], trained(31))
    assert schedule.due() == kill(1, 31)


def test_the_same_fault_twice_fires_twice_once_per_attempt():
    schedule = FaultSchedule([kill(1, 14), kill(1, 14)])
    schedule.observe([start(0)], trained(14, 15, 16))
    assert schedule.due() == kill(1, 14)
    assert schedule.due() is None  # one fault per attempt: step 16 no longer counts
    schedule.observe([], trained(17, 18))  # the struck attempt is not followed any more
    assert schedule.due() is None
    schedule.observe([start(12)], trained(13))
    assert schedule.due() is None
    schedule.observe([], trained(14))
    assert schedule.due() == kill(1, 14)


def test_a_repaired_run_that_resumed_past_the_step_fires_at_its_first_report():
    schedule = FaultSchedule([kill(0, 10), Fault("preempt", 1, 11)])
    schedule.observe([start(0)], trained(10, 11, 12))
    assert schedule.due() == kill(0, 10)
    schedule.observe([start(12)], [])
    # The repaired run resumed from the step-12 checkpoint: the run as it is now is past 11,
    # so the preemption fires at once instead of never.
    assert schedule.due() == Fault("preempt", 1, 11)


def test_faults_the_run_is_already_past_are_skipped():
    schedule = FaultSchedule([kill(0, 5), kill(1, 20), kill(0, 12)], run_step=12)
    assert schedule.skipped == [kill(0, 5), kill(0, 12)]
    assert schedule.pending == [kill(1, 20)]


def test_each_boot_holds_the_trainers_at_the_faults_still_to_strike(tmp_path):
    from infra.local.faults import FaultGates, FaultSchedule
    from training import fault_gate

    schedule = FaultSchedule([Fault("kill", 1, 8), Fault("preempt", 0, 14), Fault("kill", 1, 3)], run_step=4)
    gates = FaultGates(tmp_path / "gates")
    gates.follow(schedule)
    first = gates.boot()
    assert first == {fault_gate.DIR_ENV: str(tmp_path / "gates" / "1"), fault_gate.STEPS_ENV: "8,14"}  # 3 is past
    held = fault_gate.FaultGate.from_env(first)
    schedule.observe([{"event": "start", "step": 4}], [{"step": 8, "loss": 1.0}])
    assert schedule.due() == Fault("kill", 1, 8)
    gates.strike(8)  # the struck attempt's trainers go on (into the repair)
    assert (tmp_path / "gates" / "1" / "8").exists() and not (tmp_path / "gates" / "1" / "14").exists()
    assert held.holds(14)
    second = gates.boot()  # the repaired run waits afresh, and only for what is left
    assert second[fault_gate.STEPS_ENV] == "14" and second[fault_gate.DIR_ENV].endswith("/2")
    gates.open_up_to(None)
    gates.open_up_to(13)
    assert not (tmp_path / "gates" / "2" / "14").exists()
    gates.open_up_to(20)  # reported past 14 with no fault due there (e.g. one for a later attempt)
    assert (tmp_path / "gates" / "2" / "14").exists()
    command = FaultGates(tmp_path / "cmd", bundled_trainer=False)
    command.follow(schedule)
    assert command.boot() == {}  # a stack's own command knows no gate
