"""infra.local.withholds and the repairs around a withheld slice (``local up --withhold``).

A slice whose capacity is withheld has no VM until its capacity is back: no repair of another slice,
no reset and no fault aimed at it boots it early, and once back it is recreated once (the emu stack's
2 slices × 1 worker booted with a stand-in for the startup script: tests/helpers/standin_vms.py). The
``until-step`` form: parsed against the stack (only an elastic one trains on without the slice), released
at its step, and on Compute Engine the trainers wait at that step until the returned slice's trainers
heartbeat."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.local.emulated_stack import Options
from infra.local.faults import Fault, FaultGates, FaultSchedule, FaultSpecError
from infra.local.withholds import Withhold, parse_withhold, parse_withholds, withhold_shape
from tests.helpers.emulation import compute_engine_stack
from tests.helpers.readme import ROOT, bash_lines, page
from tests.helpers.standin_vms import booted, running, wait_until_up
from training import fault_gate, heartbeats

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
ELASTIC = {"minSlices": 1, "shrinkAfter": "30s", "growAfter": "5s"}


def stack_file(tmp_path: Path, elastic: dict | None = ELASTIC) -> Path:
    """The emu stack (24 steps, 2 slices), with ``elastic`` settings if given."""
    data = yaml.safe_load(STACK.read_text())
    if elastic is not None:
        data["config"]["multislice:elastic"] = elastic
    path = tmp_path / "stack" / "Pulumi.emu.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


# --- the until-step form -----------------------------------------------------------------------


def test_until_step_is_a_form_of_its_own():
    assert withhold_shape("1:until-step-80") == ("1", "80")
    assert withhold_shape(" 1 : until-step-007 ") == ("1", "007")
    assert withhold_shape("1:90s") == ("1", Withhold(seconds=90.0))
    assert str(Withhold(until_step=80)) == "until the run reaches step 80"
    assert str(Withhold(seconds=40.0)) == "for 40 s"


@pytest.mark.parametrize("value", ["until-step-", "until-step-x", "until-step-8x", "until-step-٨", "until-step--3"])
def test_an_until_step_without_a_step_is_malformed(value):
    with pytest.raises(FaultSpecError) as err:
        withhold_shape(f"1:{value}")
    assert str(err.value) == (
        f"--withhold '1:{value}' is malformed: {value!r} names no step; the form is SLICE:DURATION or "
        "SLICE:until-step-STEP, e.g. --withhold 1:120s or --withhold 1:until-step-80"
    )


def test_an_until_step_is_checked_against_the_stack(tmp_path):
    config = load_stack_file(stack_file(tmp_path))
    faults = [Fault("preempt", 1, 8), Fault("kill", 1, 4)]
    assert parse_withhold("1:until-step-20", slices=2, faults=faults, stack=config) == (1, Withhold(until_step=20))
    # At the last step: back after the final checkpoint (the run completes as it is: docs/faults.md).
    assert parse_withhold("1:until-step-24", slices=2, faults=faults, stack=config) == (1, Withhold(until_step=24))
    assert parse_withholds(
        ["1:until-step-5", "0:1m"], slices=2, faults=[*faults, Fault("kill", 0, 3)], stack=config
    ) == {
        1: Withhold(until_step=5),
        0: Withhold(seconds=60.0),
    }
    refusals = {
        "1:until-step-25": "step 25 is outside the run: training.steps is 24, so the capacity can come back at "
        "steps 1..24",
        "1:until-step-0": "step 0 is outside the run",
        "1:until-step-" + "9" * 30: "step 99999999… (30 digits) is outside the run",
        # The first fault that strikes slice 1 (kill at 4) takes its capacity: it comes back after that.
        "1:until-step-4": "step 4 is not after --kill 1@4, the first fault that strikes slice 1: the capacity "
        "comes back after it is lost",
    }
    for spec, says in refusals.items():
        with pytest.raises(FaultSpecError) as err:
            parse_withhold(spec, slices=2, faults=faults, stack=config)
        assert str(err.value).startswith(f"--withhold {spec!r}: {says}") or str(err.value).startswith(
            f"--withhold {spec[:20]!r}… ({len(spec):,} characters): {says}"
        ), err.value


@pytest.mark.parametrize(
    ("elastic", "why"),
    [
        (None, "the stack is not elastic (multislice:elastic.minSlices is unset)"),
        (
            {"minSlices": 2},
            "the stack is not elastic (multislice:elastic.minSlices is 2, every one of multislice:slices)",
        ),
    ],
)
def test_an_until_step_needs_a_stack_that_trains_on_without_the_slice(tmp_path, elastic, why):
    config = load_stack_file(stack_file(tmp_path, elastic))
    with pytest.raises(FaultSpecError) as err:
        parse_withhold("1:until-step-20", slices=2, faults=[Fault("kill", 1, 8)], stack=config)
    assert str(err.value) == (
        f"--withhold '1:until-step-20': {why}, so the run reaches no step without slice 1: withhold it for a "
        "duration instead (e.g. --withhold 1:120s)"
    )


def test_local_up_refuses_an_until_step_in_one_line_before_anything_starts(tmp_path, monkeypatch):
    from infra.emulated import state as local_state
    from infra.local import emulated_stack

    def started(*args, **kwargs):
        raise AssertionError("the run started despite a bad --withhold")

    monkeypatch.setattr(local_state, "acquire_lock", started)
    monkeypatch.setattr(emulated_stack.EmulatedStack, "up", started)
    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(tmp_path / "state"))
    plain = stack_file(tmp_path, elastic=None)
    args = ["local", "up", "--config-file", str(plain), "--kill", "1@8", "--withhold", "1:until-step-20"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        "error: --withhold '1:until-step-20': the stack is not elastic (multislice:elastic.minSlices is unset), so "
        "the run reaches no step without slice 1: withhold it for a duration instead (e.g. --withhold 1:120s)"
    ]
    assert not (tmp_path / "state").exists()


# --- the gates: the trainers wait at an until-step until let go ------------------------------------


def test_an_until_step_holds_every_boot_until_let_go(tmp_path):
    gates = FaultGates(tmp_path / "gates")
    gates.follow(FaultSchedule([Fault("preempt", 1, 8)]), waits=[20])
    first = gates.boot()
    assert first[fault_gate.STEPS_ENV] == "8,20"
    gates.open_up_to(30)  # the run reported past it with no fault due: still shut
    assert (tmp_path / "gates" / "1" / "8").exists() and not (tmp_path / "gates" / "1" / "20").exists()
    gates.let_go(20)
    assert (tmp_path / "gates" / "1" / "20").exists()
    assert gates.boot()[fault_gate.STEPS_ENV] == "8"  # a later boot waits for the fault still to strike alone


def test_a_fault_that_struck_nothing_leaves_the_schedule_armed():
    schedule = FaultSchedule([Fault("kill", 1, 10), Fault("kill", 0, 12)])
    schedule.observe([{"event": "start", "step": 0}], [{"step": 10, "loss": 1.0}])
    assert schedule.due() == Fault("kill", 1, 10)
    schedule.struck_nothing(10)  # slice 1 had no VM: no attempt ended, no start will come
    schedule.observe([], [{"step": 12, "loss": 1.0}])
    assert schedule.due() == Fault("kill", 0, 12)


# --- the repairs: nothing boots a withheld slice, and it is recreated once ------------------------


@pytest.fixture
def resource(tmp_path):
    with booted(STACK, tmp_path) as resource:
        yield resource


def withheld_slice_1(resource, **options) -> Options:
    """Slice 1 struck (SIGKILL at step 5) with its capacity withheld until the run reaches step 20."""
    options = Options(withhold={1: Withhold(until_step=20)}, reboot_grace_s=120, reset_grace_s=120, **options)
    assert resource.repairs.inject(Fault("kill", 1, 5), options, observed_step=5)
    assert resource.lines[-1] == (
        "capacity: none for slice 1 until the run reaches step 20 (--withhold); the other slices run on"
    )
    return options


@pytest.mark.parametrize("what", ["a repair of another slice", "a reset", "a fault aimed at it"])
def test_nothing_boots_a_withheld_slice_before_its_capacity_is_back(resource, what):
    slice0, slice1 = resource.vms
    options = withheld_slice_1(resource)
    assert not running(slice1.pgid) and slice1.boots == 1
    if what == "a repair of another slice":
        assert resource.repairs.inject(Fault("kill", 0, 9), options, observed_step=9)
        assert resource.lines[-1] == ("repair: recreating slice 0; slice(s) 1 stay without capacity (--withhold)")
    elif what == "a reset":
        resource.repairs.reset(options)
    else:
        assert not resource.repairs.inject(Fault("kill", 1, 9), options, observed_step=9)
        assert resource.lines[-1] == (
            "fault: kill slice 1 at step 9: nothing to strike, slice 1 has no VMs (its capacity is withheld until "
            "the run reaches step 20: --withhold)"
        )
        assert (resource.gates.directory / "9").exists()  # its trainers go on past the fault's step
        assert resource.repairs.faults_fired == ["kill slice 1 at step 5"]  # no restart to account for
    if slice0.boots > 1:
        wait_until_up(resource)  # restarted: its SIGTERM handler set before the next restart
    assert slice1.boots == 1 and not running(slice1.pgid), resource.lines
    assert running(slice0.pgid)
    assert [vm.pgid for vm in resource.repairs.running()] == [slice0.pgid]
    # Back once the run reaches step 20: recreated once, as the queued resource does (every slice restarts).
    assert not resource.repairs.release_withheld(options, step=19)
    boots = slice0.boots
    assert resource.repairs.release_withheld(options, step=20)
    assert resource.lines[-2:] == [
        "capacity: slice 1's capacity is back (the run reached step 20)",
        "repair: recreating slice 1, restarting slice(s) 0",
    ]
    assert (slice0.boots, slice1.boots) == (boots + 1, 2) and running(slice1.pgid)
    assert not resource.repairs.release_withheld(options, step=24) and slice1.boots == 2  # once only
    assert resource.repairs.returned_with_restart == 1


@pytest.fixture
def on_demand_compute_engine(tmp_path):
    """The compute-engine emu stack (2 slices × 2 VMs), on-demand: Compute Engine recovers a slice
    itself, and only the recreated slice boots (nothing restarts the others)."""
    path = compute_engine_stack(tmp_path)
    path.write_text(path.read_text().replace("  multislice:capacity: spot\n", "  multislice:capacity: on-demand\n"))
    with booted(path, tmp_path) as resource:
        yield resource


def beat(resource, slice_id: int, worker: int, at: float) -> None:
    """What a trainer of that worker writes as it starts: its heartbeat (training/heartbeats.py)."""
    record = heartbeats.Beat(slice_id=slice_id, worker=worker, workers=2, host="127.0.0.1", time=at)
    resource.run_dir.write(heartbeats.name(slice_id, worker), record.to_json())


def test_on_compute_engine_the_trainers_wait_at_the_step_until_the_returned_slice_is_up(on_demand_compute_engine):
    resource = on_demand_compute_engine
    resource.gates.follow(FaultSchedule([]), waits=[20])
    resource.gates.boot()  # the boot the trainers wait in
    options = Options(withhold={1: Withhold(until_step=20)}, reboot_grace_s=120)
    assert resource.repairs.inject(Fault("kill", 1, 5), options, observed_step=5)
    slice1 = resource.workers.of_slice(1)
    beat(resource, 1, 0, 1.0)  # from before the fault: says nothing of the recreated slice
    beat(resource, 1, 1, 1.0)
    assert resource.repairs.release_withheld(options, step=20)
    assert resource.lines[-2:] == [
        "capacity: slice 1's capacity is back (the run reached step 20)",
        "repair: recreating slice 1; the other slices go on",
    ]
    assert all(vm.boots == 2 for vm in slice1) and all(vm.boots == 1 for vm in resource.workers.of_slice(0))
    gate = resource.gates.directory / "20"
    resource.repairs.let_go_returned(resource.run_dir)
    assert not gate.exists()
    _, since = resource.repairs.returning[1]
    beat(resource, 1, 0, since + 1)  # one worker of two is up
    resource.repairs.let_go_returned(resource.run_dir)
    assert not gate.exists()
    beat(resource, 1, 1, since + 1)
    resource.repairs.let_go_returned(resource.run_dir)
    assert gate.exists() and resource.repairs.returning == {}
    assert resource.lines[-1] == "capacity: slice 1's trainers are up; the run goes on past step 20"
    assert resource.gates.boot() == {}  # no later boot waits there


# --- the documented example: docs/faults.md, "Elastic slices" ------------------------------------


class _Started(Exception):
    """``local up`` took its options and would start the run."""


def test_the_documented_example_is_taken_as_written(tmp_path, monkeypatch):
    """The lines of docs/faults.md's example, run as written with ``tmp_path`` as ``~``: the stack file
    they write loads, and ``local up`` takes the command's options (its run is the slow part: run by hand,
    docs/faults.md shows its output)."""
    from infra.local import lifecycle

    lines = [line for line in bash_lines(page("faults.md")) if "Pulumi.elastic.yaml" in line]
    *setup, command = lines
    assert command.startswith("uv run --frozen multislice local up --config-file ~/Pulumi.elastic.yaml"), lines
    for line in setup:
        subprocess.run(["bash", "-c", line], cwd=ROOT, env=os.environ | {"HOME": str(tmp_path)}, check=True)
    taken: list[Options] = []

    def started(config, paths, options, **kwargs):
        taken.append(options)
        raise _Started

    monkeypatch.setattr(lifecycle, "run_recorded", started)
    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(tmp_path / "state"))
    words = shlex.split(command.replace("~/", f"{tmp_path}/"))[4:]  # after `uv run --frozen multislice`
    assert words[:2] == ["local", "up"], command
    result = CliRunner().invoke(app, words, env={"COLUMNS": "200"})
    assert isinstance(result.exception, _Started), result.output
    (options,) = taken
    assert options.withhold == {1: Withhold(until_step=80)} and options.faults == [Fault("preempt", 1, 50)]
    config = load_stack_file(tmp_path / "Pulumi.elastic.yaml")
    assert config.elastic.min_slices == 1 and config.elastic.shrink_after >= 30
