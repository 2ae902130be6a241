"""``multislice local status``: the same status as a deployed stack's, from the emulation's
state file and its stored run (read through a temporary emulated Cloud Storage); the marks
of ``--plot``; and the command's imports (nothing heavy)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.emulated import gcs, gcs_clients, supervisor
from infra.emulated.state import LocalPaths, record_deletion
from infra.status import capacity
from infra.status.plot import kept_and_recomputed, marks
from tests.fakes.synthetic_run import Fault, SyntheticRun, upload
from tests.helpers.emulation import RUN_DIR, STACK

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(state_dir: Path, *args: str):
    return CliRunner().invoke(
        app, list(args), env={"COLUMNS": "250", "MULTISLICE_STATE_DIR": str(state_dir)}, color=False
    )


def store_run(state_dir: Path, run: SyntheticRun) -> None:
    """Store ``run`` as the emu stack's run, as an earlier `local up` would (the emulation's backend)."""
    config = load_stack_file(STACK)
    with gcs.GcsServer(state_dir / "emu" / "gcs", state_dir / "writer.log") as server:
        server.create_bucket(config.bucket_name)
        restore = gcs_clients.point_clients_at(server.url)
        try:
            upload(RUN_DIR, run.objects())
        finally:
            restore()


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory) -> tuple[Path, SyntheticRun]:
    state_dir = tmp_path_factory.mktemp("state")
    run = SyntheticRun(
        total_steps=24,
        steps_done=20,
        log_every=2,
        checkpoint_every=6,
        faults=[Fault("failure", 9), Fault("preemption", 14)],
    )
    store_run(state_dir, run)
    return state_dir, run


def test_local_status_of_a_stored_run(stored_run):
    state_dir, run = stored_run
    result = invoke(state_dir, "local", "status", "--config-file", str(STACK))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "stack emu: not running"
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.stdout.splitlines()]
    rows = {row[0]: row[1] for row in cells if len(row) == 2 and row[0]}
    assert rows["emulated queued resource"] == "multislice-emu: NOT_RUNNING"
    assert rows["step"] == "20/24  83%"
    assert rows["eta"] == "- (nothing runs the trainer: `local up` resumes the run)"  # no time while stopped
    assert rows["loss"] == f"{run.metrics[-1]['loss']:.4f} (step 20)"  # the latest loss, not a "final" one
    assert "final_loss" not in result.stdout
    starts = [e for e in run.events if e["event"] == "start"]
    assert rows["training_seconds"] == f"{run.metrics[-1]['time'] - starts[0]['time']:.1f}"
    assert rows["restarts"] == "2 (1 after a preemption)"
    assert rows["run_dir"] == RUN_DIR


def test_local_status_as_json_matches_the_deployed_keys(stored_run):
    state_dir, run = stored_run
    result = invoke(state_dir, "local", "status", "--config-file", str(STACK), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"stack", "emulated", "checked_at", "queued_resource", "run"}
    assert data["emulated"] is True and data["queued_resource"]["state"] == "NOT_RUNNING"
    assert (data["run"]["step"], data["run"]["restarts"], data["run"]["preemptions"]) == (20, 2, 1)
    assert data["run"]["training_seconds"] > 0


def test_local_status_plot(stored_run, tmp_path):
    state_dir, _run = stored_run
    path = tmp_path / "run.png"
    result = invoke(state_dir, "local", "status", "--config-file", str(STACK), "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_a_plot_before_the_first_step_says_why_it_is_empty(tmp_path):
    from infra.status.plot import NO_STEPS_YET

    store_run(tmp_path, SyntheticRun(total_steps=24, steps_done=0, log_every=2, checkpoint_every=6))
    path = tmp_path / "run.png"
    result = invoke(tmp_path, "local", "status", "--config-file", str(STACK), "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert result.stderr == f"wrote {path} ({NO_STEPS_YET})\n"


def test_an_elastic_resize_is_marked_as_one():
    events = [
        {"event": "start", "step": 0, "time": 1.0, "slices": 2, "full_slices": 2},
        {"event": "preempted", "step": 20, "time": 2.0},
        {"event": "start", "step": 20, "restored": True, "time": 3.0, "slices": 1, "full_slices": 2},
        {"event": "preempted", "step": 30, "time": 4.0, "membership_epoch": 2},
        {"event": "start", "step": 30, "restored": True, "time": 5.0, "slices": 2, "full_slices": 2},
    ]
    assert [(m.kind, m.step, m.label) for m in marks(events)] == [
        ("resize", 20, "elastic resize: saved step 20"),
        ("restore", 20, "restored step 20"),
        ("resize", 30, "elastic resize: saved step 30"),
        ("restore", 30, "restored step 30"),
    ]


def test_local_status_without_a_run(tmp_path):
    result = invoke(tmp_path, "local", "status", "--config-file", str(STACK))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert f"error: no run in {RUN_DIR} yet (stack emu: not running)" in result.stderr


def test_a_running_emulation_reports_each_slices_vms(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    paths.root.mkdir(parents=True)
    alive = subprocess.Popen(["sleep", "60"], start_new_session=True)
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    try:
        paths.state_file.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "pid_start": supervisor.start_ticks(os.getpid()),
                    "stack": "emu",
                    "emulation_id": "x",
                    "vms": [
                        {"slice": 0, "worker": 0, "node": "multislice-emu-0", "pgid": alive.pid},
                        {"slice": 1, "worker": 0, "node": "multislice-emu-1", "pgid": gone.pid},
                    ],
                }
            )
        )
        status = capacity.read_local(paths, "multislice-emu", ["multislice-emu-0", "multislice-emu-1"], 1)
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        alive.wait()
    assert status.state == "ACTIVE" and status.detail == f"emulator pid {os.getpid()}"
    assert [(s.state, s.vms_running, s.vms) for s in status.slices] == [("READY", 1, 1), ("REPAIRING", 0, 1)]


def test_a_queued_resource_deleted_after_its_run_completed(tmp_path):
    # What `local up` leaves when the VMs deleted the queued resource (deleteOnComplete): the
    # run complete and the deletion recorded; reported as the deployed status reports a queued
    # resource gone after its run completed (test_status_cli.py).
    store_run(tmp_path, SyntheticRun(total_steps=24, steps_done=24, log_every=2, checkpoint_every=6))
    paths = LocalPaths(tmp_path / "emu")
    name = "projects/multislice-tests/locations/us-central2-b/queuedResources/multislice-emu"
    record_deletion(paths, name, RUN_DIR)
    result = invoke(tmp_path, "local", "status", "--config-file", str(STACK))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "stack emu: not running; its queued resource multislice-emu was deleted"
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.stdout.splitlines()]
    rows = {row[0]: row[1] for row in cells if len(row) == 2 and row[0]}
    assert rows["emulated queued resource"].startswith("multislice-emu: DELETED (deleted by worker 0 of slice 0 at ")
    assert rows["complete"].startswith("COMPLETE at") and rows["step"] == "24/24  100%"
    data = json.loads(invoke(tmp_path, "local", "status", "--config-file", str(STACK), "--json").stdout)
    assert (data["queued_resource"]["state"], data["queued_resource"]["slices"]) == ("DELETED", [])
    # Created again (a new `local up` trains): not deleted any more.
    paths.deletion_file.unlink()
    data = json.loads(invoke(tmp_path, "local", "status", "--config-file", str(STACK), "--json").stdout)
    assert data["queued_resource"]["state"] == "NOT_RUNNING"


def test_marks_come_from_the_events():
    run = SyntheticRun(
        total_steps=30,
        steps_done=30,
        log_every=2,
        checkpoint_every=6,
        faults=[Fault("failure", 10), Fault("preemption", 20)],
    )
    run.objects()
    steps = [r for r in run.metrics if "loss" in r]
    found = [(m.kind, m.step) for m in marks(run.events, steps)]
    # the failure after step 10 (synced through step 10) resumes from the step-6 checkpoint; the
    # preemption saves step 20 and resumes there
    assert found == [("failure", 10), ("restore", 6), ("preemption", 20), ("restore", 20)]
    # without the step records the failure is marked where the run resumed
    assert [(m.kind, m.step) for m in marks(run.events)][0] == ("failure", 6)
    kept, lost = kept_and_recomputed(steps)
    assert [r["step"] for r in kept] == list(range(1, 31))
    assert [r["step"] for r in lost] == [7, 8, 9, 10]


def test_status_imports_nothing_heavy(tmp_path):
    # The command modules, and a whole `local status` run: no jax, orbax, pulumi, matplotlib,
    # nor the storage and TPU client libraries (infra/status/store.py, capacity.py say why).
    code = (
        "import sys\n"
        "from infra.cli import app\n"
        "import infra.cli.status, infra.status.reader, infra.status.progress, infra.status.capacity, "
        "infra.status.report, infra.status.store\n"
        f"try:\n    app(['local', 'status', '--config-file', {str(STACK)!r}, '--json'])\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('jax', 'orbax', 'orbax.checkpoint', 'pulumi', "
        "'matplotlib', 'tensorflow', 'gcsfs', 'google.cloud.tpu_v2', 'google.cloud.storage') "
        "if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "HEAVY []" in result.stderr, result.stderr
    assert "no run in" in result.stderr  # the command ran


def test_an_already_complete_run_reports_the_commands_wall_time(bucket, tmp_path):
    # `local up` on a finished run only reports it; its wall_seconds is the time the command took
    # (this process's age), not 0.
    import time
    from types import SimpleNamespace

    import psutil

    from infra.local import lifecycle
    from infra.local.options import Options
    from training.run_dir import RunDir

    run_dir = f"gs://{bucket}/runs/done"
    upload(run_dir, SyntheticRun(total_steps=6, steps_done=6, log_every=2, checkpoint_every=6).objects())
    config = load_stack_file(STACK).model_copy(
        update={"training": load_stack_file(STACK).training.model_copy(update={"steps": 6})}
    )
    resource = SimpleNamespace(config=config, run_dir=RunDir(run_dir), paths=LocalPaths(tmp_path / "emu"))
    before = time.time() - psutil.Process().create_time()
    said = []
    outcome = lifecycle.train(resource, Options(faults=[]), False, said.append)
    after = time.time() - psutil.Process().create_time()
    assert outcome.already_complete  # reported, nothing trained
    assert said == [f"run {run_dir} is already complete; nothing to do (use --fresh to start over)"]
    summary = outcome.summary
    assert summary["complete"] is True
    assert before <= summary["wall_seconds"] <= after + 0.01
    assert summary["capacity"] == "kept"  # no deletion recorded for this run
    # Its VMs deleted the queued resource when it completed: said, and nothing is created.
    resource.paths.root.mkdir(parents=True)
    record_deletion(resource.paths, "projects/p/locations/z/queuedResources/multislice-emu", run_dir)
    outcome = lifecycle.train(resource, Options(faults=[]), False, said.append)
    assert outcome.already_complete and outcome.summary["capacity"] == "deleted"
    assert said[-1].startswith(f"run {run_dir} is already complete; nothing to do (its queued resource was deleted at ")
    assert not resource.paths.state_file.exists() and not (resource.paths.root / "vms").exists()
