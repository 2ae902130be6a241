"""`multislice local up` on a stack whose workload is a user's own command
(tests/stacks/Pulumi.emu-command.yaml: tests/fakes/workload/workload_program.py, a plain JAX
program): it joins the emulated job with ``jax.distributed.initialize()`` and no arguments, sees
every chip of both slices, survives a kill and a preemption through its own Orbax checkpoints, and
completes; the run directory holds what ``status`` reads.

One emulation (about a minute on 2 cores); run it alone (``-n 0``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.emulated import gcs_clients
from tests import compilation_cache
from training.metrics.restarts import restarts_of
from training.metrics.run_log import read_records
from training.run_dir import RunDir

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"
STACK_CONFIG = load_stack_file(STACK)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_command_survives_a_kill_and_a_preemption_and_completes(tmp_path):
    summary_path = tmp_path / "summary.json"
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(tmp_path), "COLUMNS": "200", **compilation_cache.env()}
    for key in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES"):
        env.pop(key, None)
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "local", "up", "--config-file", str(STACK)]
        + ["--summary-json", str(summary_path), "--kill", "1@6", "--preempt", "0@14"],
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["steps_completed"] == 24
    assert (summary["repairs"], summary["restarts"], summary["capacity"]) == (2, 2, "deleted")
    logs = "".join(p.read_text() for p in sorted((tmp_path / STACK_CONFIG.stack / "logs").glob("slice-*.log")))
    # Both processes saved the step they agreed on after the notice and exited 75; the command
    # itself asserted jax.device_count() == 8 (it exits 78 otherwise, never restarted).
    assert (
        logs.count(
            "exited with status 75: it saved a checkpoint after a stop notice "
            "(a preemption, a maintenance event, a stop)"
            " or to change its slice count (elastic)"
        )
        == 2
    )
    assert "exited with status 78" not in logs
    with gcs_clients.clients_pointed_at(tmp_path / STACK_CONFIG.stack / "gcs", tmp_path / "reader.log") as stored:
        assert stored
        run_dir = RunDir(STACK_CONFIG.run_dir)
        events = read_records(run_dir, "events")
        metrics = read_records(run_dir, "metrics")
        completion = json.loads(run_dir.read("COMPLETE") or b"{}")
    starts = [e for e in events if e["event"] == "start"]
    assert [e["workload"] for e in starts] == ["command"] * 3 and starts[0]["step"] == 0
    # The kill: the emulator polls for progress, so the SIGKILL lands at some step K ≥ 6 (later
    # on a loaded machine, and the command may report more steps between the emulator's poll and
    # the SIGKILL); the command resumed from its newest checkpoint (every 4 steps) ≤ the newest
    # step the killed attempt reported (the summary's fault_steps; the command writes a step's
    # metrics before it saves that step).
    killed_at = int(
        re.search(r"fault: kill slice 1 at step 6 \(SIGKILL; training had reported step (\d+)\)", result.stdout)[1]
    )
    reached = summary["fault_steps"][0]
    assert 6 <= killed_at <= reached
    assert starts[1]["restored"] and 0 < starts[1]["step"] <= reached and starts[1]["step"] % 4 == 0
    # The kill is a failure; after the command's exit 75, the launcher recorded the preemption
    # (the command itself writes no event), so status counts that restart as one.
    assert [r.cause for r in restarts_of(events)] == ["failure", "preemption"]
    assert {r["step"] for r in metrics if "loss" in r} == set(range(1, 25))
    assert completion["step"] == 24 and completion["loss"] == pytest.approx(summary["final_loss"])
