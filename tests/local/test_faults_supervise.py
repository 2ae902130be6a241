"""Faults a step apart through the emulator's own loop (``EmulatedStack.up``) without JAX: each
emulated VM boots a stand-in trainer that writes what training.train writes to the gs:// run
directory (a ``start`` event with the step it resumed from, one ``metrics`` window per step,
a "checkpoint" every 6 steps, ``COMPLETE`` at the end), so the faults' timing, the repairs
and the summary's restarts are checked in seconds, deterministically. The real trainer's run
is tests/local/test_faults_emulation.py."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.emulated.state import LocalPaths
from infra.local import emulated_stack
from infra.local.emulated_stack import EmulatedStack, Options
from infra.local.faults import Fault
from infra.local.progress import ProgressSample
from training.metrics.run_log import RecordLog, read_records
from training.run_dir import RunDir

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
ROOT = Path(__file__).resolve().parents[2]

#: Slice 0 trains: resumes from the newest "checkpoint" (multiples of 6), one step every
#: 50 ms, one metrics window per step; slice 1 waits for COMPLETE. Both exit 0 at the end.
STAND_IN = """
import json, os, sys, time
from training.run_dir import RunDir
from training.metrics.run_log import RecordLog
run = RunDir(sys.argv[1])
if os.environ["MULTISLICE_HOME"].rstrip("/").endswith("slice-1-worker-0"):
    while run.read("COMPLETE") is None:
        time.sleep(0.05)
    sys.exit(0)
start = int(run.read("ckpt") or b"0")
events, metrics = RecordLog(run, "events"), RecordLog(run, "metrics")
events.append({"event": "start", "step": start, "restored": start > 0, "time": time.time()})
events.sync()
for step in range(start + 1, 25):
    time.sleep(0.05)
    metrics.append({"step": step, "loss": 1.0 / step})
    metrics.sync()
    if step % 6 == 0:
        run.write("ckpt", str(step).encode())
run.write("COMPLETE", json.dumps({"step": 24, "loss": 1.0 / 24}).encode())
"""


def startup_script(run_dir: str) -> str:
    return f"""#!/bin/bash
cd {ROOT}
exec {sys.executable} -c '{STAND_IN}' {run_dir}
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "faults",
    [
        [Fault("kill", 1, 8), Fault("kill", 1, 9)],  # a step apart
        [Fault("kill", 1, 8), Fault("kill", 1, 8)],  # the same fault twice
        [Fault("preempt", 0, 8), Fault("kill", 1, 9)],
    ],
    ids=["a-step-apart", "twice", "preempt-then-kill"],
)
def test_each_fault_acts_on_the_run_as_it_is_now(tmp_path, faults):
    config = load_stack_file(STACK)
    lines: list[str] = []
    samples: list[ProgressSample] = []
    resource = EmulatedStack(
        config,
        LocalPaths(tmp_path / "emu"),
        startup_script(config.run_dir),
        report=lines.append,
        progress=samples.append,
    )
    options = Options(
        faults=faults, poll_s=0.05, reboot_grace_s=10, preempt_grace_s=10, stall_timeout_s=120, timeout_s=500
    )
    with resource.running():
        summary = resource.up(options)
        events = read_records(RunDir(config.run_dir), "events")
        metrics = read_records(RunDir(config.run_dir), "metrics")
    assert summary["complete"] is True
    assert summary["faults"] == [str(f) for f in faults]
    assert (summary["repairs"], summary["restarts"]) == (2, 2)
    # The restarts shown while running agree with the summary's, at every step shown.
    assert samples[-1].restarts == summary["restarts"]
    assert samples[-1].step == 24  # the last window, read after the VMs exited, is shown too
    assert [s.restarts for s in samples] == sorted(s.restarts for s in samples)
    assert all(fired >= fault.step for fired, fault in zip(summary["fault_steps"], faults, strict=True))
    starts = [e["step"] for e in events if e["event"] == "start"]
    assert len(starts) == 3 and starts[0] == 0
    # Where each fault really fired: the last step the attempt it struck reported (the
    # stand-in syncs every step). The next attempt resumed at or before it, and every step in
    # between was computed twice.
    fired = summary["fault_steps"]
    steps = [r["step"] for r in metrics if "loss" in r]
    assert all(step in steps for step in fired)
    assert all(resumed <= at for resumed, at in zip(starts[1:], fired, strict=True))
    assert summary["steps_lost"] == sum(at - resumed for resumed, at in zip(starts[1:], fired, strict=True))
    # In the emulator's report: start, fault, resume, fault, resume; each fault at a step that
    # the attempt it struck had reached (the second one: after the first repair's resume).
    order = [re.sub(r" \(.*", "", line) for line in lines if line.startswith(("fault: ", "training "))]
    assert order == [
        "training started at step 0",
        f"fault: {faults[0]}",
        f"training resumed from the checkpoint of step {starts[1]}",
        f"fault: {faults[1]}",
        f"training resumed from the checkpoint of step {starts[2]}",
    ]
    reached = [int(m) for line in lines for m in re.findall(r"training had reported step (\d+)\)", line)]
    assert reached[0] >= faults[0].step
    assert reached[1] >= max(faults[1].step, starts[1])
    assert all(seen <= fired for seen, fired in zip(reached, summary["fault_steps"], strict=True))


@pytest.mark.timeout(300)
def test_a_resumed_run_shows_the_restarts_of_its_earlier_attempts_as_the_summary_does(tmp_path):
    # An earlier `local up` of the run started the trainer twice, then stopped at step 8.
    config = load_stack_file(STACK)
    lines: list[str] = []
    samples: list[ProgressSample] = []
    resource = EmulatedStack(
        config,
        LocalPaths(tmp_path / "emu"),
        startup_script(config.run_dir),
        report=lines.append,
        progress=samples.append,
    )
    with resource.running():
        run = RunDir(config.run_dir)
        events, metrics = RecordLog(run, "events"), RecordLog(run, "metrics")
        now = time.time()
        events.append({"event": "start", "step": 0, "restored": False, "time": now - 20})
        events.append({"event": "start", "step": 0, "restored": False, "time": now - 10})
        for step in range(1, 9):
            metrics.append({"step": step, "loss": 1.0 / step, "time": now - 10 + step})
        events.close()
        metrics.close()
        run.write("ckpt", b"6")
        summary = resource.up(Options(poll_s=0.05, stall_timeout_s=120, timeout_s=250))
    assert summary["complete"] is True and summary["restarts"] == 2
    assert samples and {s.restarts for s in samples} == {2}


@pytest.mark.timeout(300)
def test_a_fault_that_found_the_run_at_its_end_still_shows_its_restart(tmp_path, monkeypatch):
    """The emulator's first look at the run comes only once the run is complete (its first sleep
    waits for COMPLETE): the fault at step 8 strikes then, and the repaired attempt resumes at
    step 24 with no new step to show. Its restart is shown all the same, as the summary counts it."""
    config = load_stack_file(STACK)
    samples: list[ProgressSample] = []
    resource = EmulatedStack(
        config,
        LocalPaths(tmp_path / "emu"),
        startup_script(config.run_dir),
        report=lambda line: None,
        progress=samples.append,
    )
    sleep, poll_s = time.sleep, 0.0503  # the loop's sleeps: no other caller sleeps that long
    first = [True]

    def first_sleep_waits_for_the_end(seconds: float) -> None:  # time.sleep, for every caller
        if first[0] and seconds == poll_s:
            first[0] = False
            deadline = time.monotonic() + 120
            while RunDir(config.run_dir).read("COMPLETE") is None:
                assert time.monotonic() < deadline, "the stand-in never completed"
                sleep(0.05)
        sleep(seconds)

    monkeypatch.setattr(emulated_stack.time, "sleep", first_sleep_waits_for_the_end)
    with resource.running():
        summary = resource.up(Options(faults=[Fault("kill", 1, 8)], poll_s=poll_s, reboot_grace_s=10, timeout_s=250))
    assert summary["complete"] is True and summary["fault_steps"] == [24]
    assert summary["restarts"] == 1 and samples[-1].restarts == 1
