"""``multislice local exec`` (infra.remote.emulated) on stand-in emulated VMs: processes that
carry an emulation id, recorded in a state file as a running ``local up`` records its VMs. The
command runs in each VM's directory with that VM's environment; a stack with no local run, a
deleted one, or a VM not running now is refused with nothing run. The real emulation is
exercised in tests/local/test_reset_emulation.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.emulated import state as state_lib
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


@pytest.fixture
def vms(tmp_path):
    """Two stand-in VMs of stack emu (2 slices × 1 worker) recorded as a running emulation."""
    paths = LocalPaths(tmp_path / "state" / "emu")
    emulation_id = uuid.uuid4().hex
    procs = []
    for s in range(2):
        home = paths.vm_home(s, 0)
        home.mkdir(parents=True)
        env = {"PATH": os.environ["PATH"], EMULATION_ID_ENV: emulation_id, "VM_ONLY": f"vm-{s}"}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"], env=env, cwd=home, start_new_session=True
            )
        )
    vm_records = [{"slice": s, "worker": 0, "node": f"multislice-emu-{s}", "pgid": p.pid} for s, p in enumerate(procs)]
    state_lib.write_state(paths, stack="emu", emulation_id=emulation_id, vms=vm_records)
    yield paths, procs
    for proc in procs:
        proc.kill()
        proc.wait()


def local_exec(tmp_path, *args: str):
    return CliRunner().invoke(
        app,
        ["local", "exec", "--config-file", str(STACK), *args],
        env={"MULTISLICE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"},
        color=False,
    )


def test_the_command_runs_in_each_vms_directory_with_its_environment(tmp_path, vms):
    paths, _ = vms
    result = local_exec(tmp_path, "--", 'echo "$VM_ONLY $PWD"; test "$VM_ONLY" != vm-1')
    assert result.exit_code == 1, result.output
    lines = sorted(result.stdout.splitlines())
    assert lines == [f"[slice {s} worker 0] vm-{s} {paths.vm_home(s, 0)}" for s in range(2)]
    error = " ".join(result.stderr.split())
    assert "error: 1 of 2 worker(s) failed: slice 1 worker 0 (exit 1)" in error
    (log_dir,) = (paths.root / "exec").iterdir()  # the default: under the stack's local state
    assert (log_dir / "slice-0-worker-0.log").read_text() == f"vm-0 {paths.vm_home(0, 0)}\n"


def test_one_slice_only(tmp_path, vms):
    result = local_exec(tmp_path, "--slice", "1", "--log-dir", str(tmp_path / "out"), "--", "echo $VM_ONLY")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[slice 1 worker 0] vm-1"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["slice-1-worker-0.log"]


def test_a_vm_that_is_not_running_now_is_named_and_nothing_runs(tmp_path, vms):
    paths, procs = vms
    procs[1].kill()
    procs[1].wait()
    result = local_exec(tmp_path, "--", f"touch {tmp_path / 'ran'}")
    assert result.exit_code == 1
    assert "slice 1 worker 0 of stack emu's local run is not running now" in " ".join(result.stderr.split())
    assert not (tmp_path / "ran").exists()


def test_a_stack_with_no_local_run_says_what_to_run_first(tmp_path):
    result = local_exec(tmp_path, "--", "hostname")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: stack emu has no local run: start one with `multislice local up --config-file {STACK}` first "
        "(in another terminal)"
    )


def test_a_deleted_emulated_queued_resource_is_named(tmp_path):
    paths = LocalPaths(tmp_path / "state" / "emu")
    paths.root.mkdir(parents=True)
    config = load_stack_file(STACK)
    state_lib.record_deletion(paths, config.queued_resource_name, config.run_dir)
    result = local_exec(tmp_path, "--", "hostname")
    assert result.exit_code == 2
    assert "deleted once its run completed (deleteOnComplete)" in result.stderr
    # The hint names the stack as this command did (a file outside stacks/): it works as printed.
    assert f"multislice local up --config-file {STACK} --fresh" in " ".join(result.stderr.split())


def test_a_worker_the_stack_lacks_is_refused(tmp_path, vms):
    result = local_exec(tmp_path, "--worker", "1", "--", "hostname")
    assert result.exit_code == 2
    assert "--worker 1: each slice of stack emu (v4-8) has 1 worker(s), 0" in " ".join(result.stderr.split())
