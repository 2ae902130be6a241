"""Elastic slices end to end in ``multislice local up``, on the queued-resource and compute-engine
backends: slice 1 is preempted at step 8 (of 36) and its capacity withheld (``--withhold 1:60s``); the run
goes on with slice 0 alone once ``shrinkAfter`` has passed (one restart: the trainers end with the
preemption save and start again as a job of one slice), is held at step 22 until slice 1 is back
(``--hold-at``, so that the return lands inside the run on any machine), grows back to both slices
(on the queued resource at the platform's restart of every slice; on Compute Engine at the next
checkpoint, the recreated slice ready first), and completes. ``local status`` shows the slice
count while slice 0 trains alone; the summary names both changes, and no restart is unplanned."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.emulation import CLI, STACK, cli_env, processes_under

# shrinkAfter above a trainer restart (the unit's backoff and the start): a member restarting into the
# next epoch is not taken for lost.
ELASTIC = {"minSlices": 1, "shrinkAfter": "30s", "growAfter": "5s"}


def elastic_stack(tmp_path: Path, backend: str) -> Path:
    """The emu stack, elastic, on ``backend`` (compute-engine: a v5p-8 slice, which it offers)."""
    data = yaml.safe_load(STACK.read_text())
    config = data["config"]
    config["multislice:elastic"] = ELASTIC
    config["multislice:training"]["steps"] = 36  # checkpoints every 6: the grow lands at 24, before the end
    if backend == "compute-engine":
        config.update({"multislice:backend": backend, "multislice:acceleratorType": "v5p-8", "gcp:zone": "us-east5-a"})
    path = tmp_path / "Pulumi.elastic.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def state_dir(tmp_path):
    yield tmp_path / "state"
    for pid in processes_under(tmp_path):  # what a failed run left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["queued-resource", "compute-engine"])
def test_a_run_trains_on_without_a_withheld_slice_and_grows_back(tmp_path, state_dir, backend):
    stack = elastic_stack(tmp_path, backend)
    summary_path = tmp_path / "summary.json"
    up = subprocess.Popen(
        [
            *CLI,
            "local",
            "up",
            "--config-file",
            str(stack),
            "--preempt",
            "1@8",
            "--preempt-grace",
            "5",
            "--withhold",
            "1:60s",
            "--hold-at",
            "22",
            "--summary-json",
            str(summary_path),
        ],
        env=cli_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")) if up.stdout else None)
    reader.start()

    def wait_for(text: str, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in lines):
            assert up.poll() is None or any(text in line for line in lines), "".join(lines)
            assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n" + "".join(lines)
            time.sleep(0.5)

    try:
        wait_for("elastic: slices 2 → 1")
        wait_for("1 of 2 slices")  # slice 0's job started: it trains alone
        status = subprocess.run(
            [*CLI, "local", "status", "--config-file", str(stack)],
            env=cli_env(state_dir),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert "1 of 2 (elastic: the others are lost" in " ".join(status.stdout.split()), status.stdout
        wait_for("repair: recreating slice 1")
        wait_for("elastic: slices 1 → 2")  # the recreated slice is ready: the change is decided
        (state_dir / "elastic" / "holds").mkdir(parents=True, exist_ok=True)
        (state_dir / "elastic" / "holds" / "22").touch()
        up.wait(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
        reader.join(timeout=10)
    out = "".join(lines)
    assert up.returncode == 0, out
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] and summary["steps_completed"] == 36, out
    # The job agreed on a step at or after the notice and saved it; slice 0 alone resumed from there.
    alone = re.search(
        r"training resumed from the checkpoint of step (\d+) \(1 processes, 4 devices; 1 of 2 slices\)", out
    )
    assert alone and 8 <= int(alone[1]) < 22, out
    changes = summary["slice_changes"]
    assert len(changes) == 2, changes
    assert changes[0] == f"slices 2 → 1 at step {alone[1]} (slice 1 lost, not back within 30s)", changes
    grown = re.fullmatch(r"slices 1 → 2 at step (\d+) \(slice 1 back, 5s after the last change\)", changes[1])
    assert grown and int(alone[1]) < int(grown[1]) <= 24, changes
    assert summary["unplanned_restarts"] == [], out
    assert summary["reduced_capacity_seconds"] > 0, summary  # slice 0's steps alone: productive, fewer slices
    assert "(2 processes, 8 devices)" in out.split("elastic: slices 1 → 2")[1], out
    assert processes_under(state_dir) == []
