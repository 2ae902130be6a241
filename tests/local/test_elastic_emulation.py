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
    assert "(2 processes, 8 devices)" in out.split("elastic: slices 1 → 2 decided")[1], out
    assert processes_under(state_dir) == []


def three_slice_stack(tmp_path: Path, backend: str, grow_after: str) -> Path:
    """The emu stack as 3 slices that may train on 2 (DCN data 3 → 2: 24 sequences split over 12
    replicas and over 8), on ``backend``, with ``growAfter`` ``grow_after``."""
    path = elastic_stack(tmp_path, backend)
    data = yaml.safe_load(path.read_text())
    config = data["config"]
    config["multislice:slices"] = 3
    config["multislice:elastic"] = {"minSlices": 2, "shrinkAfter": "30s", "growAfter": grow_after}
    config["multislice:training"]["global_batch_size"] = 24
    config["multislice:training"]["parallelism"]["dcn"]["data"] = 3
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("backend", "grow_after", "back_at"),
    [("queued-resource", "10m", 20), ("compute-engine", "5s", 36)],
    ids=["back-before-growAfter-queued-resource", "back-after-the-last-checkpoint-compute-engine"],
)
def test_three_slices_lose_slice_0_train_on_two_and_end_whenever_it_returns(
    tmp_path, state_dir, backend, grow_after, back_at
):
    """Slice 0 (the coordinator's) is preempted at step 8 and its capacity withheld until the run
    reaches ``back_at``: slices 1 and 2 go on as a job of 2 (a count that does not divide 3), and
    slice 0 comes back either before ``growAfter`` has passed (it stands by) or after the final
    checkpoint (no change is taken after it). Either way the run completes with that one change, the
    returned slice leaves the gate when the run is complete, and ``local up`` returns; on the queued
    resource the slice that finished the run (1, the job's first) deletes the capacity.

    Each case runs on one backend, the two backends between them: the gate, the shrink and the end
    are the trainer's (training/elastic), the same on both; each backend's own part (a recreated
    queued resource restarting every slice, a recreated instance group joining at a checkpoint) is
    in both cases of the test above. Every case on both backends was four runs of about 120 s, with
    the test above a sixth of the suite's CPU (docs/development.md)."""
    stack = three_slice_stack(tmp_path, backend, grow_after)
    summary_path = tmp_path / "summary.json"
    up = subprocess.run(
        [
            *CLI,
            "local",
            "up",
            "--config-file",
            str(stack),
            "--preempt",
            "0@8",
            "--preempt-grace",
            "5",
            "--withhold",
            f"0:until-step-{back_at}",
            "--summary-json",
            str(summary_path),
        ],
        env=cli_env(state_dir),
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = up.stdout + up.stderr
    assert up.returncode == 0, out
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] and summary["steps_completed"] == 36, out
    assert re.search(r"\(2 processes, 8 devices; 2 of 3 slices\)", out), out  # slices 1 and 2 trained alone
    (change,) = summary["slice_changes"]
    shrunk = re.fullmatch(r"slices 3 → 2 at step (\d+) \(slice 0 lost, not back within 30s\)", change)
    assert shrunk and 8 <= int(shrunk[1]) < back_at, change
    assert summary["unplanned_restarts"] == [], out
    returned = (Path(summary["logs_dir"]) / "slice-0-worker-0.log").read_text(errors="replace")
    # It stood by in the gate, and left when the run completed.
    assert "elastic: the run is complete (step 36): slice 0 leaves the gate" in returned, returned[-3000:]
    if backend == "queued-resource":
        assert summary["capacity"] == "deleted", out
        assert "capacity: deleted: worker 0 of slice 1 deleted the queued resource" in out, out
    assert processes_under(state_dir) == []
