"""Stopping `multislice local up`: `local down` at any moment (even before any VM boots), and
SIGINT to the whole process group without a terminal. The command returns only once every
emulated VM process is gone and leaves no state file. A stop the user asked for ends with one line
saying how to resume, not an error: exit 0 after `local down` (which records its request before
its SIGTERM), 130 after Ctrl-C; any other SIGTERM is an error, exit 143."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.emulation import CLI, PRINTED_CLI, cli_env, long_stack, processes_under, run_cli


def start_up(tmp_path: Path) -> subprocess.Popen:
    """`local up` in its own process group (as a shell job is), without a terminal."""
    return subprocess.Popen(
        CLI + ["local", "up", "--config-file", str(long_stack(tmp_path))],
        env=cli_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"local up exited before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def state(tmp_path: Path) -> dict | None:
    try:
        return json.loads((tmp_path / "emu" / "emulator.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_local_down_right_after_local_up_starts_stops_it(tmp_path):
    proc = start_up(tmp_path)
    try:
        wait_for(lambda: state(tmp_path) is not None, proc, "its state file")  # recorded before anything starts
        assert state(tmp_path)["pid"] == proc.pid
        down = run_cli(["local", "down", "--stack", "emu"], tmp_path, timeout=120)
        assert down.returncode == 0, down.stderr
        assert f"asked emulator pid {proc.pid} to stop" in down.stdout
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err  # the documented stop: on purpose
    assert f"stopped by `{PRINTED_CLI} local down`: every emulated VM was stopped; resume with: " in err
    assert "error:" not in err
    assert processes_under(tmp_path) == []
    assert state(tmp_path) is None
    assert "no local run is running" in run_cli(["local", "down"], tmp_path).stdout


@pytest.mark.slow
def test_sigint_to_the_process_group_returns_only_once_every_vm_is_gone(tmp_path):
    proc = start_up(tmp_path)
    try:
        wait_for(lambda: (state(tmp_path) or {}).get("vms"), proc, "the VMs to boot")
        wait_for(lambda: len(processes_under(tmp_path)) > 2, proc, "the VMs' processes")
        # What Ctrl-C does without a terminal, twice: a launcher (uv run) may forward it too.
        signal_group = lambda: __import__("os").killpg(proc.pid, signal.SIGINT)  # noqa: E731
        signal_group()
        time.sleep(0.2)
        if proc.poll() is None:
            signal_group()
        out, err = proc.communicate(timeout=120)
        left = processes_under(tmp_path)  # right when the command returned
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    assert f"interrupted (Ctrl-C): every emulated VM was stopped; resume with: {PRINTED_CLI} local up" in err
    assert "Traceback" not in err
    assert left == []
    assert state(tmp_path) is None


def test_a_stop_signal_that_arrives_as_another_exception_still_exits_as_a_stop():
    """CI saw `local down` land while `local up` imported numpy, which re-raised the stop as
    ImportError: `local up` crashed with exit 1 and a traceback instead of exiting 143."""
    code = """if True:
        import os, signal, sys
        from infra.local import lifecycle
        from infra.local.options import Options

        def run_locked(*args, **kwargs):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000):  # the handler runs between bytecodes
                    pass
            except Exception as err:  # as numpy/__init__.py does
                raise ImportError("numpy._core.multiarray failed to import") from err
            sys.exit("the stop signal never arrived")

        lifecycle._run_locked = run_locked
        lifecycle.run_recorded(None, None, Options(), fresh=False, gcs_port=None, say=print, progress=None,
                               on_stop=lambda stop: print(f"error: {stop}", file=sys.stderr))
        sys.exit("run_recorded returned")
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "stopped by SIGTERM" in proc.stderr
    assert "Traceback" not in proc.stderr
