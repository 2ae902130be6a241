"""`multislice local up` end to end: 2 emulated slices (1 worker × 4 CPU devices each) run the
rendered startup script; a killed or preempted slice is repaired and training resumes from the
last checkpoint with per-step losses bit-identical to an uninterrupted run; nothing is left
running afterwards. Bad input fails fast with one clear message.

Two full runs are shared by several tests (module fixtures): the uninterrupted reference, and
one run with a kill and then a preemption, which the kill's and the preemption's tests both read."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest
import yaml

from infra.config import load_stack_file
from infra.emulated import gcs, gcs_clients
from tests.helpers.emulation import (
    CLI,
    PRINTED_CLI,
    REPORT,
    RUN_DIR,
    STACK,
    cli_env,
    long_stack,
    processes_under,
    run_cli,
    run_records,
    stop_if_running,
    waiting_stack,
)
from training import host_allocator
from training.metrics.run_log import RecordLog
from training.run_dir import RunDir


def listening(port: int) -> bool:
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in psutil.net_connections("tcp"))


@pytest.fixture(autouse=True)
def no_vm_outlives_its_test(tmp_path_factory):
    """Cleanup, after a test's own assertions: a test that failed or timed out may have killed
    its emulator and left that run's VMs training; kill them, so that they do not slow down
    the tests that follow."""
    yield
    for pid in processes_under(tmp_path_factory.getbasetemp()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_causes_add_up(state_dir: Path) -> dict:
    """The run's goodput.json (written by the trainer at completion): productive time and the
    badput causes add up to the wall time, so no cause counts time twice (``other``, what no
    record explains, is never negative, and is a small part here); each attempt's causes add up
    to the run's. The report."""
    with gcs_clients.clients_pointed_at(state_dir / "emu" / "gcs", state_dir / "reader.log") as stored:
        assert stored
        report = json.loads(RunDir(RUN_DIR).read("goodput.json") or b"null")
    badput, wall = report["badput"], report["wall_seconds"]
    assert report["productive_seconds"] + sum(badput.values()) == pytest.approx(wall, abs=0.01), report
    assert 0 <= badput["other"] <= 0.1 * wall, report
    for cause in set(badput) - {"other"}:
        assert sum(a["badput"][cause] for a in report["per_attempt"]) == pytest.approx(badput[cause], abs=0.01)
    return report


def step_losses(state_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in run_records(state_dir, "metrics") if "loss" in r]


def up(tmp_path: Path, *extra: str, stack: Path = STACK) -> dict:
    summary_path = tmp_path / "summary.json"
    result = run_cli(
        ["local", "up", "--config-file", str(stack), "--summary-json", str(summary_path), *extra], tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_under(tmp_path) == []
    summary = json.loads(summary_path.read_text())
    assert summary["run_dir"] == RUN_DIR  # the gs:// run directory `pulumi up` gives the VMs
    summary["stdout"] = result.stdout
    summary["state_dir"] = tmp_path
    return summary


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The reference run, read to its last progress line only: the reader then leaves, as
    `multislice local up | head` does (test_closed_stdout_after_the_last_step_still_completes
    asserts what that does; the others, the run itself). Its summary (from --summary-json),
    the stdout it read, the stderr and the exit status."""
    state_dir = tmp_path_factory.mktemp("uninterrupted")
    summary_path = state_dir / "summary.json"
    command = CLI + ["local", "up", "--config-file", str(STACK), "--summary-json", str(summary_path)]
    proc = subprocess.Popen(command, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = [b""]
        while b"step 24/24" not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1], (lines, proc.communicate(timeout=60))
        proc.stdout.close()
        err = proc.stderr.read().decode()
        returncode = proc.wait(timeout=120)
    finally:
        stop_if_running(proc)
    assert returncode == 0, b"".join(lines).decode() + err
    assert processes_under(state_dir) == []
    summary = json.loads(summary_path.read_text())
    assert summary["run_dir"] == RUN_DIR  # the gs:// run directory `pulumi up` gives the VMs
    summary.update(stdout=b"".join(lines).decode(), stderr=err, returncode=returncode, state_dir=state_dir)
    return summary


@pytest.mark.slow
def test_uninterrupted_run_completes(uninterrupted):
    assert uninterrupted["complete"] is True
    assert (uninterrupted["steps_completed"], uninterrupted["restarts"], uninterrupted["steps_lost"]) == (24, 0, 0)
    losses = step_losses(uninterrupted["state_dir"])
    assert [s for s, _ in losses] == list(range(1, 25))
    assert uninterrupted["final_loss"] == losses[-1][1]
    for key in ("steps_completed", "final_loss", "restarts", "steps_lost", "wall_seconds", "run_dir"):
        assert key in uninterrupted
    log = (Path(uninterrupted["logs_dir"]) / "slice-1-worker-0.log").read_text()
    assert "[slice 1 worker 0] " in log and "process 1/2" in log
    # The trainer re-executed itself with glibc's huge-page tunable (training/host_allocator.py).
    if host_allocator.glibc_has_tunable() and "GLIBC_TUNABLES" not in os.environ:
        assert "host allocator: GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in log


@pytest.mark.slow
def test_the_completed_run_deleted_its_queued_resource(uninterrupted):
    # The emu stack is spot: deleteOnComplete is on by default. Once the trainers exited 0,
    # worker 0 of slice 0 deleted the queued resource through the emulated TPU API.
    config = load_stack_file(STACK)
    assert config.capacity == "spot" and config.delete_on_complete
    name = f"projects/{config.project}/locations/{config.zone}/queuedResources/{config.queued_resource_id}"
    assert uninterrupted["capacity"] == "deleted"  # --summary-json
    log = (Path(uninterrupted["logs_dir"]) / "slice-0-worker-0.log").read_text().splitlines()
    done = log.index("[slice 0 worker 0] trainer: exited with status 0: training is complete")
    assert log[done + 1 : done + 3] == [
        f"[slice 0 worker 0] capacity: the run is complete: deleting queued resource {name} (force: its nodes first)",
        f"[slice 0 worker 0] capacity: deleted: the TPU API accepted the delete of {name}",
    ]
    assert "capacity:" not in (Path(uninterrupted["logs_dir"]) / "slice-1-worker-0.log").read_text()
    status = run_cli(["local", "status", "--config-file", str(STACK), "--json"], uninterrupted["state_dir"])
    assert status.returncode == 0, status.stderr
    capacity = json.loads(status.stdout)["queued_resource"]
    assert (capacity["state"], capacity["slices"]) == ("DELETED", [])
    assert capacity["detail"].startswith("deleted by worker 0 of slice 0 at ")


def synchronous_saves(directory: Path) -> Path:
    """The emu stack (same name, same run directory) with ``checkpoint.async_save: false``.

    With asynchronous saves, step 6's checkpoint may still be unfinalized when a loaded
    machine reports step 8 and the kill lands; the run then restarts from scratch (a CI run
    did). A kill test is about the kill: a synchronous save is finalized before step 7
    starts, so the kill at step ≥ 8 always finds it. Kills during an asynchronous save are
    tests/training/test_kill_during_save.py's subject."""
    document = yaml.safe_load(STACK.read_text())
    document["config"]["multislice:training"]["checkpoint"]["async_save"] = False
    directory.mkdir(parents=True, exist_ok=True)
    stack = directory / STACK.name
    stack.write_text(yaml.safe_dump(document))
    return stack


@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> dict:
    """One run with two faults, read by the kill and the preemption tests: slice 1 killed at
    step 8 (SIGKILL: the steps since the last checkpoint are lost and computed again), then
    slice 0 preempted at step 14 of the repaired run (SIGTERM: a preemption checkpoint, no step
    lost). Its summary (with the stdout), events, per-step losses and goodput report (whose
    causes add up: :func:`assert_causes_add_up`)."""
    state_dir = tmp_path_factory.mktemp("faulted")
    faulted = up(state_dir, "--kill", "1@8", "--preempt", "0@14", stack=synchronous_saves(state_dir / "stack"))
    faulted.update(
        events=run_records(state_dir, "events"), records=step_losses(state_dir), report=assert_causes_add_up(state_dir)
    )
    return faulted


@pytest.mark.slow
def test_killed_slice_is_repaired_and_resumes_bit_identically(uninterrupted, faulted):
    assert faulted["complete"] is True
    assert faulted["restarts"] == 2 and faulted["faults"] == ["kill slice 1 at step 8", "preempt slice 0 at step 14"]
    assert "repair: recreating slice 1, restarting slice(s) 0" in faulted["stdout"]
    # The trainers wait at step 8 until the emulator strikes (training.fault_gate), so the SIGKILL
    # lands at K = 8 on any machine; training resumes from the newest checkpoint R ≤ K (interval
    # 6, so R = 6) and steps R+1..K are computed twice. The preemption that follows loses no step
    # (test_preempted_slice_saves_then_resumes_without_losing_steps), so the steps run
    # 1..K, then R+1..24.
    records = faulted["records"]
    steps = [s for s, _ in records]
    resumed = [e["step"] for e in faulted["events"] if e["event"] == "start"][1]
    reached = len(steps) - (24 - resumed)  # steps 1..K, then R+1..24
    assert reached >= 8 and resumed % 6 == 0 and 6 <= resumed <= reached
    observed = int(
        re.search(r"fault: kill slice 1 at step 8 \(SIGKILL; training had reported step (\d+)\)", faulted["stdout"])[1]
    )
    assert observed == reached == 8 and resumed == 6
    assert f"training resumed from the checkpoint of step {resumed}" in faulted["stdout"]
    assert faulted["steps_lost"] == reached - resumed
    assert steps == list(range(1, reached + 1)) + list(range(resumed + 1, 25))
    reference = dict(step_losses(uninterrupted["state_dir"]))
    assert dict(records) == reference  # final loss of every step, compared exactly
    assert all(loss == reference[step] for step, loss in records)  # the redone steps too
    report = faulted["report"]
    assert [a["ended"] for a in report["per_attempt"]] == ["lost", "preempted", "complete"]
    assert report["per_attempt"][1]["badput"]["boot"] > 0 and report["badput"]["checkpoint_restore"] > 0
    assert report["per_attempt"][1]["badput"]["checkpoint_restore"] > 0  # the kill's restore
    if reached > resumed:
        assert report["per_attempt"][0]["badput"]["recomputed_steps"] > 0


@pytest.mark.slow
def test_a_crashed_trainer_and_its_peers_restart_warm_on_their_vms_and_resume_bit_identically(uninterrupted, tmp_path):
    """An application failure (``--crash 1@8``: slice 1's trainer SIGKILLed, an OOM kill, a runtime
    crash) leaves the VMs up: slice 1's unit restarts its trainer, slice 0's ends on the lost peer and
    its unit restarts it too, and every restart is forked by its VM's warm standby (docs/vm-boot.md,
    "The warm standby")."""
    summary_path = tmp_path / "summary.json"
    command = ["local", "up", "--config-file", str(STACK), "--crash", "1@8", "--summary-json", str(summary_path)]
    out = subprocess.run(CLI + command, env=cli_env(tmp_path), capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["restarts"] >= 1, out.stdout
    assert summary["unplanned_restarts"] == [], out.stdout
    assert re.search(r"fault: crash slice 1 at step 8 \(SIGKILL to its trainer, pid \d+; the VMs stay up", out.stdout)
    assert "repair:" not in out.stdout  # no VM was recreated or rebooted
    for vm in ("slice-0-worker-0", "slice-1-worker-0"):
        log = (tmp_path / "emu" / "logs" / f"{vm}.log").read_text()
        starts = re.findall(r"trainer: (warm start at once|warm start after waiting|cold start)", log)
        assert len(starts) >= 2 and starts[1:] == ["warm start at once"] * (len(starts) - 1), (vm, starts)
    events = run_records(tmp_path, "events")
    kinds = [e.get("start_kind") for e in events if e["event"] == "start"]
    assert kinds[1:] and set(kinds[1:]) == {"warm"}, kinds
    reference = dict(step_losses(uninterrupted["state_dir"]))
    records = step_losses(tmp_path)
    assert all(loss == reference[step] for step, loss in records) and dict(records) == reference


@pytest.mark.slow
def test_preempted_slice_saves_then_resumes_without_losing_steps(uninterrupted, faulted):
    assert faulted["complete"] is True
    assert faulted["restarts"] == 2  # the kill's, then the preemption's
    assert "repair: recreating slice 0, restarting slice(s) 1" in faulted["stdout"]
    # The preemption struck the attempt that resumed after the kill, at a step P ≥ 14 of it;
    # the trainer saved a checkpoint at P and stopped, the next attempt resumed from it.
    starts = [e["step"] for e in faulted["events"] if e["event"] == "start"]
    assert len(starts) == 3 and starts[2] >= 14
    # Every attempt found each device's slice as on Cloud TPU: from the emulated chips' slice_index.
    assert {e["slices_by"] for e in faulted["events"] if e["event"] == "start"} == {"slice_index"}
    # The notice reached the trainers waiting at step 14 (training.fault_gate), not later.
    assert (
        "fault: preempt slice 0 at step 14 (SIGTERM, then SIGKILL after grace; training had reported step 14)"
        in (faulted["stdout"])
    )
    assert f"preemption checkpoint saved at step {starts[2]}" in faulted["stdout"]
    assert f"training resumed from the checkpoint of step {starts[2]}" in faulted["stdout"]
    # No step lost to it: from the kill's resume point R on, through the preemption, every step
    # is computed once, in order; the steps lost are the kill's alone (its attempt's records
    # after R); and every step's loss is the uninterrupted run's.
    steps = [s for s, _ in faulted["records"]]
    after_kill = len(steps) - (24 - starts[1])
    assert steps[after_kill:] == list(range(starts[1] + 1, 25)) and starts[1] < starts[2] < 24
    assert faulted["steps_lost"] == sum(1 for s in steps[:after_kill] if s > starts[1])
    assert dict(faulted["records"]) == dict(step_losses(uninterrupted["state_dir"]))
    report = faulted["report"]
    assert [a["ended"] for a in report["per_attempt"]] == ["lost", "preempted", "complete"]
    preempted = report["per_attempt"][1]
    assert preempted["badput"]["recomputed_steps"] == 0 and preempted["badput"]["checkpoint_save"] > 0
    assert report["per_attempt"][2]["start_step"] == starts[2] and report["per_attempt"][2]["restored"]


@pytest.mark.slow
def test_finished_run_is_reported_without_retraining(uninterrupted, tmp_path):
    state = uninterrupted["state_dir"]
    before = run_records(state, "metrics")
    summary_path = state / "again.json"
    result = run_cli(["local", "up", "--config-file", str(STACK), "--summary-json", str(summary_path)], state)
    assert result.returncode == 0, result.stderr
    assert "already complete; nothing to do (its queued resource was deleted at " in result.stdout
    assert "booting" not in result.stdout  # deleted and complete: converged, nothing is created again
    assert json.loads(summary_path.read_text())["capacity"] == "deleted"
    assert (state / "emu" / "deleted.json").exists()
    assert run_records(state, "metrics") == before
    assert processes_under(state) == []


def _error_of(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: "), result.stderr
    return result.stderr


def test_missing_stack(tmp_path):
    text = _error_of(run_cli(["local", "up", "--stack", "nope"], tmp_path))
    assert "no stack 'nope'" in text and "stacks here: " in text


def test_malformed_stack_file(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config:\n  multislice:slices: [2\n")
    assert "is not valid YAML" in _error_of(run_cli(["local", "up", "--config-file", str(bad)], tmp_path))


def test_invalid_stack_names_the_key(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(STACK.read_text().replace("multislice:slices: 2", "multislice:slices: 3"))
    text = _error_of(run_cli(["local", "up", "--config-file", str(bad)], tmp_path))
    assert "multislice:training.parallelism.dcn: data×fsdp×tensor = 2×1×1 = 2 must equal multislice:slices: 3" in text


def test_bad_fault_spec(tmp_path):
    text = _error_of(run_cli(["local", "up", "--config-file", str(STACK), "--kill", "5@3"], tmp_path))
    assert "--kill '5@3': slice 5 does not exist: the stack has 2 slices (slices 0..1)" in text


def test_corpus_glob_matching_nothing(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        STACK.read_text().replace(
            "    sequence_length: 32", f"    data: {{source: '{tmp_path}/none/*.txt'}}\n    sequence_length: 32"
        )
    )
    text = _error_of(run_cli(["local", "up", "--config-file", str(bad)], tmp_path))
    assert "training.data.source" in text and "matches no non-empty file" in text
    assert not (tmp_path / "bad" / "emulator.json").exists()


def test_coordinator_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        text = _error_of(
            run_cli(["local", "up", "--config-file", str(STACK), "--coordinator-port", str(port)], tmp_path)
        )
    assert f"--coordinator-port {port} is already in use" in text
    assert processes_under(tmp_path) == []
    assert not (tmp_path / "emu" / "emulator.json").exists()


def test_gcs_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        text = _error_of(run_cli(["local", "up", "--config-file", str(STACK), "--gcs-port", str(port)], tmp_path))
    assert f"--gcs-port {port} is already in use" in text and "nothing was started" in text
    assert processes_under(tmp_path) == []
    assert not (tmp_path / "emu" / "emulator.json").exists()


def test_status_reads_a_stored_run_through_the_storage_api(tmp_path):
    # A run stored by an earlier `local up` (written here as the trainer writes it, through a
    # server over the stack's backend); `local status` starts its own server to read it.
    import time

    config = load_stack_file(STACK)
    t0 = time.time() - 60
    with gcs.GcsServer(tmp_path / "emu" / "gcs", tmp_path / "writer.log") as server:
        server.create_bucket(config.bucket_name)
        restore = gcs_clients.point_clients_at(server.url)
        try:
            run = RunDir(RUN_DIR)
            metrics, events = RecordLog(run, "metrics"), RecordLog(run, "events")
            events.append({"event": "start", "step": 0, "time": t0})
            for window in ((1, 2), (3, 4), (5, 6)):
                for step in window:
                    metrics.append({"step": step, "loss": 5.0 - step / 10, "time": t0 + step})
                metrics.sync()
            events.append({"event": "checkpoint", "step": 6, "time": t0 + 12.5})
            events.sync()
        finally:
            restore()
    status = run_cli(["local", "status", "--config-file", str(STACK)], tmp_path)
    assert status.returncode == 0, status.stderr
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in status.stdout.splitlines()]
    rows = {row[0]: row[1] for row in cells if len(row) == 2}  # the status table's rows
    assert "stack emu: not running" in status.stdout
    assert (rows["step"], rows["loss"]) == ("6/24  25%", f"{5.0 - 6 / 10:.4f} (step 6)")
    assert (rows["restarts"], rows["training_seconds"], rows["run_dir"]) == (
        "0 (0 after a preemption)",
        "12.5",
        RUN_DIR,
    )
    assert rows["last_checkpoint"].startswith("step 6 at") and "complete" not in rows
    empty = run_cli(["local", "status", "--config-file", str(STACK)], tmp_path / "none")
    assert empty.returncode == 1 and f"no run in {RUN_DIR} yet" in empty.stderr


def _start_background(tmp_path: Path, stack: Path | None = None) -> subprocess.Popen:
    env = cli_env(tmp_path)
    return subprocess.Popen(
        CLI + ["local", "up", "--config-file", str(stack or long_stack(tmp_path))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_training(tmp_path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until training started: every trainer process joined the job and the first one
    synced the run's ``start`` event (the first object of its events log, in the stack's bucket
    on the emulated Cloud Storage's backend: one file per object). The tests that stop a run
    need nothing later (the train step's compile, the first steps)."""
    bucket = RUN_DIR.removeprefix("gs://").split("/", 1)[0]
    events = tmp_path / "emu" / "gcs" / bucket / "runs" / "emu" / "events"
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events.is_dir() and any(events.iterdir()):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("training did not start")


def storage_port(state_dir: Path) -> int:
    """The port of the running emulation's Cloud Storage, from its state file."""
    url = json.loads((state_dir / "emu" / "emulator.json").read_text())["storage_url"]
    return int(url.rsplit(":", 1)[1])


@pytest.mark.slow
def test_ctrl_c_stops_every_vm(tmp_path):
    import signal

    proc = _start_background(tmp_path, waiting_stack(tmp_path))  # the VMs' workload only waits
    _wait_for_training(tmp_path, proc)
    assert processes_under(tmp_path)  # the emulated VMs are running
    port = storage_port(tmp_path)
    assert listening(port)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    # Stopped on purpose: one plain line saying how to resume, not an error.
    assert err.strip().splitlines()[-1] == (
        f"interrupted (Ctrl-C): every emulated VM was stopped; resume with: {PRINTED_CLI} local up "
        f"--config-file {tmp_path / 'waiting' / 'Pulumi.emu.yaml'}"
    ), err
    assert "error:" not in err
    assert processes_under(tmp_path) == []  # the VMs and the storage server
    assert not listening(port)
    assert not (tmp_path / "emu" / "emulator.json").exists()


@pytest.mark.slow
def test_closed_stdout_stops_every_vm_with_a_message(tmp_path):
    # `multislice local up | head`: the reader leaves while the run goes on.
    env = cli_env(tmp_path)
    stack = waiting_stack(tmp_path, REPORT)  # the VMs' workload reports steps, no JAX
    proc = subprocess.Popen(
        CLI + ["local", "up", "--config-file", str(stack)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        seen = []
        while not any(b" loss " in line for line in seen):
            seen.append(proc.stdout.readline())
            assert seen[-1], (seen, proc.communicate(timeout=60))
        assert processes_under(tmp_path)  # the emulated VMs are training
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 1, err
    finally:
        stop_if_running(proc)
    assert "error: standard output was closed" in err and "every emulated VM was stopped" in err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert processes_under(tmp_path) == []
    assert not (tmp_path / "emu" / "emulator.json").exists()


@pytest.mark.slow
def test_closed_stdout_after_the_last_step_still_completes(uninterrupted):
    # The reader of the uninterrupted run left after the last progress line: the run finished,
    # only the summary table found no reader; that is exit 0, and --summary-json still got the
    # summary.
    assert uninterrupted["returncode"] == 0, uninterrupted["stderr"]
    assert "error" not in uninterrupted["stderr"]
    summary_path = uninterrupted["state_dir"] / "summary.json"
    assert json.loads(summary_path.read_text())["complete"] is True
    assert processes_under(uninterrupted["state_dir"]) == []


@pytest.mark.slow
def test_local_down_stops_a_running_emulation(tmp_path):
    stack = waiting_stack(tmp_path)  # the VMs' workload only waits
    proc = _start_background(tmp_path, stack)
    _wait_for_training(tmp_path, proc)
    second = run_cli(["local", "up", "--config-file", str(long_stack(tmp_path))], tmp_path, timeout=60)
    assert f"a local run of stack 'emu' is already running (pid {proc.pid})" in _error_of(second)
    port = storage_port(tmp_path)
    assert listening(port)
    down = run_cli(["local", "down", "--stack", "emu"], tmp_path, timeout=60)
    assert down.returncode == 0, down.stderr
    assert "asked emulator pid" in down.stdout
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # stopped the documented way: on purpose, not a failure
    resume = f"resume with: {PRINTED_CLI} local up --config-file {stack}"
    assert f"stopped by `{PRINTED_CLI} local down`: every emulated VM was stopped; {resume}" in err
    assert "error:" not in err
    assert processes_under(tmp_path) == []
    assert not listening(port)
    assert "no local run is running" in run_cli(["local", "down"], tmp_path).stdout


def test_user_text_is_printed_literally(tmp_path):
    odd = tmp_path / "[bold]x" / "Pulumi.odd.yaml"
    text = _error_of(run_cli(["plan", "--config-file", str(odd)], tmp_path))
    assert "[bold]x" in text and "Traceback" not in text
    typo = tmp_path / "Pulumi.typo.yaml"
    typo.write_text(
        STACK.read_text().replace("multislice:capacity: spot", "multislice:capacity: spot\n  multislice:train: 1")
    )
    assert "multislice:train: unknown key" in _error_of(run_cli(["local", "up", "--config-file", str(typo)], tmp_path))


def test_unwritable_summary_path_fails_before_anything_runs(tmp_path):
    text = _error_of(run_cli(["local", "up", "--config-file", str(STACK), "--summary-json", str(tmp_path)], tmp_path))
    assert f"--summary-json {tmp_path}: is a directory" in text
    assert not (tmp_path / "emu" / "gcs").exists()


def test_fault_specs_take_ascii_digits_only(tmp_path):
    text = _error_of(run_cli(["local", "up", "--config-file", str(STACK), "--kill", "１@3"], tmp_path))
    assert "is malformed: the form is SLICE@STEP" in text


def test_a_stale_state_file_never_signals_an_unrelated_process(tmp_path):
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "emu").mkdir()
        (tmp_path / "emu" / "emulator.json").write_text(
            json.dumps({"pid": bystander.pid, "pid_start": 1, "stack": "emu", "emulation_id": "x", "vms": []})
        )
        result = run_cli(["local", "down", "--stack", "emu"], tmp_path)
        assert result.returncode == 0
        assert bystander.poll() is None  # still running: its start time is not the recorded one
    finally:
        bystander.kill()


@pytest.mark.slow
def test_a_killed_emulators_vms_stop_by_themselves_and_the_next_up_resumes_bit_identically(uninterrupted, tmp_path):
    # `local up` SIGKILLed mid-run (no cleanup of its own): its VMs, trainers, log shippers and
    # the emulated Cloud Storage stop by themselves (the lifeline: infra.emulated.lifeline) within
    # the stated bound; the next `local up` resumes from the last finalized checkpoint and every
    # step's loss is the uninterrupted run's.
    import time

    from infra.emulated.lifeline import ORPHAN_STOP_S

    proc = subprocess.Popen(
        CLI + ["local", "up", "--config-file", str(STACK)],
        env=cli_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while (
            not re.match(r".*step (\d+)/24", line := proc.stdout.readline())
            or int(re.match(r".*step (\d+)/24", line)[1]) < 8
        ):
            assert line, proc.communicate(timeout=60)
        # Step 6's checkpoint is saved asynchronously: on a loaded machine steps 7 and 8 can be
        # reported before Orbax finalized it (its commit_success.txt, written last on gs://),
        # and a run killed then has no checkpoint to resume from. Wait for it.
        bucket = RUN_DIR.removeprefix("gs://").split("/", 1)[0]
        finalized = tmp_path / "emu" / "gcs" / bucket / "runs" / "emu" / "checkpoints" / "6" / "commit_success.txt"
        deadline = time.monotonic() + 60
        while not finalized.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "step 6's checkpoint was not finalized"
            time.sleep(0.05)
        port = storage_port(tmp_path)
        emulation_id = json.loads((tmp_path / "emu" / "emulator.json").read_text())["emulation_id"]
        assert processes_under(tmp_path)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)  # no cleanup possible
        proc.communicate(timeout=30)
    finally:
        stop_if_running(proc)
    while (processes_under(tmp_path) or listening(port)) and time.monotonic() - killed_at < 120:
        time.sleep(0.05)
    took = time.monotonic() - killed_at
    # Printed, not asserted (ORPHAN_STOP_S is the bound measured on an idle machine): that every
    # process went by itself is what is asserted.
    print(f"every emulated process gone {took:.2f} s after `local up` was SIGKILLed (bound {ORPHAN_STOP_S} s)")
    assert processes_under(tmp_path) == [] and not listening(port), f"still there after {took:.0f} s"
    # A process of the run that does not watch the lifeline (none of ours): status names it,
    # and `local down` still stops it.
    stray = subprocess.Popen(["sleep", "600"], env={**os.environ, "MULTISLICE_EMULATION_ID": emulation_id})
    try:
        status = run_cli(["local", "status", "--config-file", str(STACK)], tmp_path)
        assert "the emulator is gone but 1 emulated process(es) still run" in " ".join(status.stdout.split())
        down = run_cli(["local", "down", "--stack", "emu"], tmp_path)
        assert f"killed 1 emulated VM process(es): {stray.pid}" in down.stdout
        assert stray.wait(timeout=10) == -signal.SIGKILL
    finally:
        stray.kill()
    resumed = up(tmp_path)
    assert resumed["complete"] is True
    starts = [e for e in run_records(tmp_path, "events") if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] and starts[1]["step"] >= 6
    # This up's resume is the user's (the earlier up was stopped): named so, never unplanned.
    resume = f"your earlier local up stopped: resumed at step {starts[1]['step']}"
    assert resumed["restart_causes"] == [resume] and resumed["unplanned_restarts"] == []
    assert "warning:" not in resumed["stdout"]
    assert f"training resumed from the checkpoint of step {starts[1]['step']}" in resumed["stdout"]
    records = step_losses(tmp_path)
    reference = dict(step_losses(uninterrupted["state_dir"]))
    assert dict(records) == reference  # the final loss of every step, compared exactly
    assert all(loss == reference[step] for step, loss in records)  # the steps computed twice too
