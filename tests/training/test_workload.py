"""training/workload.py: what a stack's own command finds in its environment (the documented
contract of docs/workloads.md), its start event and its completion marker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra import vm_contract as contract
from training import workload
from training.cluster import ClusterIdentity, parse_tpu_env
from training.metrics.run_log import read_records
from training.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]

TPU_ENV = parse_tpu_env(
    "ACCELERATOR_TYPE: 'v4-16'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\nMEGASCALE_NUM_SLICES: '2'\n"
    "MEGASCALE_SLICE_ID: '1'\nMEGASCALE_PORT: '8080'\nWORKER_ID: '1'\n"
)
IDENTITY = ClusterIdentity(
    worker=1,
    workers_per_slice=2,
    slice_id=1,
    num_slices=2,
    coordinator_address="10.0.0.2:8482",
    accelerator_type="v4-16",
)


def test_the_environment_is_the_contract():
    env = workload.command_environment(
        {"PATH": "/usr/bin", "PYTHONPATH": "/rel:/site", "KEEP": "1"},
        IDENTITY,
        TPU_ENV,
        run_dir="gs://b/runs/r/",
        steps=100,
        release="/rel",
        user_env={"XLA_FLAGS": "--x"},
        bin_dir="/venv/bin",
    )
    assert env == {
        "KEEP": "1",
        "PATH": "/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/venv",
        "PYTHONPATH": "/site",  # the release (this bundle's training package) is taken out
        "PYTHONUNBUFFERED": "1",
        "MULTISLICE_RUN_DIR": "gs://b/runs/r",
        "MULTISLICE_CHECKPOINT_DIR": "gs://b/runs/r/checkpoints",
        "MULTISLICE_METRICS_DIR": "gs://b/runs/r/metrics",
        "MULTISLICE_EVENTS_DIR": "gs://b/runs/r/events",
        "MULTISLICE_STEPS": "100",
        "MULTISLICE_SLICE": "1",
        "MULTISLICE_WORKER": "1",
        "MULTISLICE_NUM_SLICES": "2",
        "MULTISLICE_WORKERS_PER_SLICE": "2",
        "MULTISLICE_PROCESS_ID": "3",
        "MULTISLICE_NUM_PROCESSES": "4",
        "MULTISLICE_COORDINATOR_ADDRESS": "10.0.0.2:8482",
        "MULTISLICE_ACCELERATOR_TYPE": "v4-16",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8080",
        "XLA_FLAGS": "--x",
    }
    assert set(contract.WORKLOAD_ENV) | set(contract.MEGASCALE_ENV) | {contract.SLICE_ENV, contract.WORKER_ENV} <= set(
        env
    )


def test_a_single_slice_has_no_megascale_values():
    identity = ClusterIdentity(worker=0, workers_per_slice=1, slice_id=0, num_slices=1, coordinator_address="h:8482")
    env = workload.command_environment(
        {}, identity, {"WORKER_ID": "0"}, run_dir="/r", steps=1, release="/rel", user_env={}
    )
    assert not [k for k in env if k.startswith("MEGASCALE_")] and "PYTHONPATH" not in env


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": "x", "steps": 1}, "command 'x' is not a non-empty list"),
        ({"command": ["x"], "steps": 0}, "steps 0 is not a positive integer"),
        # the env's values are never shown (a value may be a secret by its name alone)
        ({"command": ["x"], "steps": 1, "env": {"A": 1}}, "env is not a mapping of strings to strings"),
    ],
)
def test_a_bad_spec_is_a_config_error(tmp_path, spec, message):
    (tmp_path / "workload.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        workload.read_spec(tmp_path / "workload.json")
    assert workload.run(tmp_path / "workload.json", str(tmp_path / "run"), None) == workload.EXIT_CONFIG


def test_start_event_and_completion_marker(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    for step in ("4", "8", "12.orbax-checkpoint-tmp-1"):
        (tmp_path / "run" / "checkpoints" / step).mkdir(parents=True)
    workload.record_start(str(run), processes=4)
    (start,) = read_records(run, "events")
    assert {k: start[k] for k in ("event", "step", "restored", "processes", "workload")} == {
        "event": "start",
        "step": 8,
        "restored": True,
        "processes": 4,
        "workload": "command",
    }
    (tmp_path / "run" / "metrics").mkdir()
    (tmp_path / "run" / "metrics" / "00000000.jsonl").write_text(
        '{"step": 9, "loss": 0.5}\n{"step": 10, "loss": 0.25}\n'
    )
    spec = tmp_path / "workload.json"
    spec.write_text(json.dumps({"command": ["x"], "steps": 10}))
    assert workload.complete(spec, str(run)) == 0
    assert json.loads(run.read("COMPLETE") or b"") == {"step": 10, "loss": 0.25}
    run.write("COMPLETE", b'{"step": 12, "loss": null}')  # the command wrote its own: kept
    assert workload.complete(spec, str(run)) == 0 and json.loads(run.read("COMPLETE") or b"")["step"] == 12


def test_a_preempted_command_is_recorded_as_the_trainer_records_it(tmp_path):
    """After exit 75, the ``preempted`` event makes status count the next start as a preemption."""
    from training.metrics.restarts import restarts_of

    run = RunDir(str(tmp_path / "run"))
    (tmp_path / "run" / "checkpoints" / "6").mkdir(parents=True)
    workload.record_start(str(run), processes=2)
    assert workload.main(["preempted", "--spec", str(tmp_path / "unused.json"), "--run-dir", str(run)]) == 0
    workload.record_start(str(run), processes=2)
    events = read_records(run, "events")
    assert [(e["event"], e["step"]) for e in events] == [("start", 6), ("preempted", 6), ("start", 6)]
    assert [(r.cause, r.preempted_step) for r in restarts_of(events)] == [("preemption", 6)]


def _supervised(tmp_path, script: str) -> subprocess.Popen:
    """``training.workload.supervise`` of a Python command, in a process of its own."""
    child = tmp_path / "child.py"
    child.write_text(script)
    launcher = (
        "import os, sys; from pathlib import Path; from training.workload import supervise; "
        f"sys.exit(supervise([sys.executable, {str(child)!r}], dict(os.environ), Path({str(tmp_path)!r})))"
    )
    return subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, cwd=ROOT)


TRAPS_SIGTERM = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while not stop:
    time.sleep(0.01)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def test_exit_0_after_sigterm_is_preempted_not_complete(tmp_path):
    """A command that saves on the notice and exits 0 (as MaxText does) stopped early: 75."""
    proc = _supervised(tmp_path, TRAPS_SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)  # to the launcher alone: it passes the notice on
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == workload.EXIT_PREEMPTED
    assert "exited 0 after a stop request" in out


@pytest.mark.parametrize(("script", "status"), [("import sys; sys.exit(0)", 0), ("import sys; sys.exit(3)", 3)])
def test_without_a_stop_the_status_is_the_commands(tmp_path, script, status):
    proc = _supervised(tmp_path, script)
    proc.communicate(timeout=60)
    assert proc.returncode == status


def test_a_command_killed_by_a_signal_kills_the_launcher_with_it(tmp_path):
    proc = _supervised(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_a_command_that_cannot_start_is_a_config_error(tmp_path):
    assert workload.supervise([str(tmp_path / "missing")], dict(os.environ), tmp_path) == workload.EXIT_CONFIG


def test_on_compute_engine_the_command_gets_the_identity_of_the_units_environment(tmp_path, monkeypatch):
    """A Compute Engine TPU VM has no Cloud TPU metadata: the launcher reads the identity boot.sh
    wrote into the unit's environment, and the command sees the MEGASCALE_* values of it."""
    from infra.emulated.metadata import MetadataServer

    env_file = tmp_path / "env.json"
    spec = tmp_path / "workload.json"
    dump = f"import json, os; json.dump(dict(os.environ), open({str(env_file)!r}, 'w'))"
    spec.write_text(json.dumps({"command": [sys.executable, "-c", dump], "steps": 3}))
    identity_env = {
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "10.2.0.4,10.2.0.9",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.3",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    for name, value in identity_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MULTISLICE_COORDINATOR_PORT", raising=False)
    with MetadataServer({"multislice-accelerator-type": "v5p-16"}) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        assert workload.run(spec, str(tmp_path / "run"), None) == 0
        asked = [path.rsplit("/", 1)[-1] for path in server.requests]
    # Only the accelerator type comes from the metadata there: no Cloud TPU key is asked for.
    assert asked == ["multislice-accelerator-type"]
    seen = json.loads(env_file.read_text())
    assert {k: seen[k] for k in identity_env if k.startswith("MEGASCALE_")} == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.3",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    # process id = slice × workers per slice + worker (JAX's BaseTpuCluster.get_process_id)
    assert (seen["MULTISLICE_PROCESS_ID"], seen["MULTISLICE_NUM_PROCESSES"]) == ("3", "4")
    assert seen["MULTISLICE_COORDINATOR_ADDRESS"] == "10.1.0.3:8482"
    assert seen["MULTISLICE_ACCELERATOR_TYPE"] == "v5p-16"
    assert not (tmp_path / "run" / "events").exists()  # process 3 is not process 0: no start event
