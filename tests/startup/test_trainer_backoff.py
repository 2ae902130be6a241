"""trainer.sh's restart backoff, run alone: which last status restarts at once (docs/vm-boot.md,
"The trainer service"). ``systemctl`` and the Python it execs are stand-ins that report a restart
after a given status and print what would run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra.startup import templates

FAKE_PYTHON = """#!/bin/bash
case "$1 $2" in
  "-m training.log_shipping") exec cat ;;
  *) echo "started: $*" ;;
esac
"""

FAKE_SYSTEMCTL = """#!/bin/bash
case "$*" in
  *NRestarts*) echo 1 ;;
  *ExecMainStatus*) echo "$FAKE_LAST_STATUS" ;;
esac
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("kind", "last", "at_once"),
    [
        ("run", "75", True),
        ("run", "69", True),  # the trainer's peer was gone: the peer's unit backs off
        ("run", "1", False),
        ("command", "75", True),
        ("command", "69", False),  # a command's 69 is its own (the workload contract gives it no meaning)
    ],
)
def test_which_last_status_restarts_at_once(tmp_path, kind, last, at_once):
    script = tmp_path / "release" / "trainer.sh"
    script.parent.mkdir()
    script.write_text(templates.template(templates.TRAINER_RESOURCE))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "systemctl", FAKE_SYSTEMCTL)
    python = _executable(tmp_path / "python", FAKE_PYTHON)
    args = [str(python), "config.json", "gs://b/run"] if kind == "run" else [str(python), "gs://b/run", "/bin"]
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_LAST_STATUS": last,
        "MULTISLICE_RESTART_BACKOFF_S": "0.01",
    }
    result = subprocess.run(
        ["bash", str(script), kind, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    unit = "trainer" if kind == "run" else "workload"
    restart = [line for line in lines if line.startswith(f"{unit}: restart 1")]
    assert len(restart) == 1, lines
    assert ("at once" in restart[0]) is at_once and ("of backoff" in restart[0]) is not at_once
    assert lines[-1].startswith("started: -m training")  # and then it started


@pytest.mark.parametrize(
    ("workload", "line"),
    [
        (False, "trainer: exited with status 69: another process of the job was gone (that process's log says why)"),
        (True, "trainer: exited with status 69 (exit-code)"),
    ],
)
def test_the_line_for_status_69(tmp_path, workload, line):
    script = tmp_path / "release" / "trainer.sh"
    script.parent.mkdir()
    script.write_text(templates.template(templates.TRAINER_RESOURCE))
    if workload:
        (script.parent / "workload.json").write_text("{}")
    env = {"PATH": os.environ["PATH"], "EXIT_CODE": "exited", "EXIT_STATUS": "69", "SERVICE_RESULT": "exit-code"}
    result = subprocess.run(
        ["bash", str(script), "stopped"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout) == (0, f"[slice ? worker ?] {line}\n"), result.stderr
