"""Faults a step apart through the emulator's own loop (``LocalQueuedResource.up``) without JAX: each
emulated VM boots a stand-in trainer that writes what training.train writes to the gs:// run
directory (a ``start`` event with the step it resumed from, one ``metrics`` window per step,
a "checkpoint" every 6 steps, ``COMPLETE`` at the end), so the faults' timing, the repairs
and the summary's restarts are checked in seconds, deterministically. The real trainer's run
is tests/local/test_faults_emulation.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.local.emulator import LocalQueuedResource, Options
from infra.local.faults import Fault
from infra.local.state import LocalPaths
from training.run_dir import RunDir
from training.run_log import read_records

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
ROOT = Path(__file__).resolve().parents[2]

#: Slice 0 trains: resumes from the newest "checkpoint" (multiples of 6), one step every
#: 50 ms, one metrics window per step; slice 1 waits for COMPLETE. Both exit 0 at the end.
STAND_IN = """
import json, os, sys, time
from training.run_dir import RunDir
from training.run_log import RecordLog
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
    resource = LocalQueuedResource(
        config, LocalPaths(tmp_path / "emu"), startup_script(config.run_dir), report=lines.append
    )
    options = Options(
        faults=faults, poll_s=0.05, reboot_grace_s=10, preempt_grace_s=10, stall_timeout_s=120, timeout_s=500
    )
    with resource.running():
        summary = resource.up(options)
        events = read_records(RunDir(config.run_dir), "events")
    assert summary["complete"] is True
    assert summary["faults"] == [str(f) for f in faults]
    assert (summary["repairs"], summary["restarts"]) == (2, 2)
    starts = [e["step"] for e in events if e["event"] == "start"]
    assert len(starts) == 3 and starts[0] == 0
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
