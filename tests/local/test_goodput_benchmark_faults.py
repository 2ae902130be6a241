"""Where benchmarks/goodput.py puts its faults: preemptions at 25 % and 50 % of the run, the
kill half a checkpoint interval after the checkpoint at or before 75 % (what a fault at a
random moment loses on average), never on a checkpoint step unless asked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def goodput():
    spec = importlib.util.spec_from_file_location("goodput_benchmark", ROOT / "benchmarks" / "goodput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dev_stack_faults_are_the_documented_ones(goodput):
    # The dev stack: 120 steps, a checkpoint every 20; the kill at 90 is 10 steps after 80.
    assert goodput.faults(120, 20) == ["--preempt", "0@30", "--preempt", "1@60", "--kill", "1@90"]


def test_the_kill_of_a_longer_run_stays_mid_interval(goodput):
    # 75 % of 480 is 360, a checkpoint step (18 × 20): the kill goes to 360 + 10.
    assert goodput.faults(480, 20) == ["--preempt", "0@120", "--preempt", "1@240", "--kill", "1@370"]
    # 75 % of 200 is 150, 10 steps after the step-140 checkpoint already.
    assert goodput.faults(200, 20)[-1] == "1@150"
    assert goodput.faults(480, 20, kill_step=360)[-1] == "1@360"


def test_up_args_use_the_dev_stack_interval(goodput, tmp_path):
    interval = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"]["multislice:training"][
        "checkpoint"
    ]["interval_steps"]
    args = goodput.up_args(480, True, tmp_path)
    kill = int(args[args.index("--kill") + 1].split("@")[1])
    assert kill % interval == interval // 2 and 360 <= kill < 360 + interval
    assert "--kill" not in goodput.up_args(480, False, tmp_path)
    copy = yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text())
    assert copy["config"]["multislice:training"]["steps"] == 480


def test_the_standby_is_turned_off_in_a_copy_of_the_stack(goodput, tmp_path):
    assert goodput.up_args(120, True, tmp_path)[:3] == ["local", "up", "--stack"]  # the dev stack itself
    args = goodput.up_args(120, True, tmp_path, standby=False)
    assert args[2:4] == ["--config-file", str(tmp_path / "Pulumi.dev.yaml")]
    copy = yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text())["config"]
    dev = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
    assert copy["multislice:warmStandby"] is False and "multislice:warmStandby" not in dev
    assert copy["multislice:training"] == dev["multislice:training"]


def test_crash_makes_the_third_fault_an_application_failure_at_the_kills_step(goodput, tmp_path):
    kill = goodput.up_args(480, True, tmp_path)
    crash = goodput.up_args(480, True, tmp_path, crash=True)
    assert "--kill" not in crash and crash[crash.index("--crash") + 1] == kill[kill.index("--kill") + 1] == "1@370"
    assert crash[: crash.index("--crash")] == kill[: kill.index("--kill")]  # the preemptions as they were


def test_each_start_is_labelled_by_how_it_began(goodput):
    assert goodput.start_label({"event": "start"}) == "cold"  # a run outside a VM records no kind
    assert goodput.start_label({"start_kind": "cold", "cold_reason": "no standby"}) == "cold"
    assert goodput.start_label({"start_kind": "warm", "standby_wait_s": 1.4}) == "warm after a wait"
    assert goodput.start_label({"start_kind": "warm"}) == "warm"
