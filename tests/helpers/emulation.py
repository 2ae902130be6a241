"""``multislice`` run as the user runs it (a subprocess) against the emu stack, and the
processes and records of the local emulations it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from infra.config import load_stack_file
from infra.local import gcs
from tests import compilation_cache
from training.metrics.run_log import read_records
from training.run_dir import RunDir

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
RUN_DIR = load_stack_file(STACK).run_dir  # gs://<the stack's bucket>/runs/emu
CLI = [sys.executable, "-m", "infra.cli"]


def cli_env(state_dir: Path) -> dict[str, str]:
    """The CLI's environment: state under ``state_dir``, JAX left to the emulator, the VMs
    sharing the session's compilation cache (tests/compilation_cache.py)."""
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(state_dir), "COLUMNS": "200", **compilation_cache.env()}
    for key in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES"):
        env.pop(key, None)
    return env


def run_cli(args: list[str], state_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, env=cli_env(state_dir), capture_output=True, text=True, timeout=timeout)


def stop_if_running(proc: subprocess.Popen) -> None:
    """Test cleanup: SIGINT makes the emulator stop its VMs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def processes_under(root: Path) -> list[int]:
    """Live processes of the emulations whose state lies under ``root``: the emulated VMs
    (their MULTISLICE_HOME) and the emulated Cloud Storage (started by the CLI, with its
    MULTISLICE_STATE_DIR); the CLI itself, once exited, is not one."""
    found = []
    for process in psutil.process_iter(["environ"], ad_value=None):
        environ = process.info["environ"] or {}
        if process.pid == os.getpid() or "MULTISLICE_EMULATION_ID" not in environ:
            continue
        home = environ.get("MULTISLICE_HOME") or environ.get("MULTISLICE_STATE_DIR")
        if home and Path(home).is_relative_to(root):
            found.append(process.pid)
    return found


def run_records(state_dir: Path, name: str) -> list[dict]:
    """Every record of log ``name`` of the emu stack's run under ``state_dir``, read as
    ``local status`` reads it: through a temporary emulated Cloud Storage over the stack's
    backend (the emulator stopped its own)."""
    with gcs.clients_pointed_at(state_dir / "emu" / "gcs", state_dir / "reader.log") as stored:
        assert stored
        return read_records(RunDir(RUN_DIR), name)


def long_stack(tmp_path: Path) -> Path:
    """The emu stack with so many steps that it cannot finish while a test interrupts it."""
    path = tmp_path / "long" / "Pulumi.emu.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(STACK.read_text().replace("    steps: 24", "    steps: 100000"))
    return path
