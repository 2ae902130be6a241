"""``multislice local status | exec | reset | down | up`` with a state directory that cannot be one
(``MULTISLICE_STATE_DIR`` a file, under a file, under /dev/null; the stack's directory a file)
or a damaged ``emulator.json``: one ``error:`` line naming the directory or the file, exit 2,
no traceback, nothing started; ``local down`` removes a damaged file that no ``local up`` holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.emulated import state as state_lib
from infra.emulated.state import LocalPaths

#: Each reading command of the ``local`` group, refused before it reads a run.
COMMANDS = {
    "status": ["local", "status"],
    "exec": ["local", "exec", "--", "true"],
    "reset": ["local", "reset", "--yes"],
    "down": ["local", "down"],
    "down --stack": ["local", "down", "--stack", "dev"],
}

#: ``emulator.json`` contents no emulator wrote, and the words that say what is wrong.
DAMAGED = {
    "pid not a number": (
        json.dumps({"pid": "abc", "emulation_id": "x", "vms": []}).encode(),
        "pid is 'abc', not a process id",
    ),
    "not UTF-8": (b"\xff\xfe\x00\x80 not text", "not UTF-8 text"),
    "not an object": (b"[1, 2, 3]", "a JSON list, not an object"),
    "torn": (b'{"pid": 12', "not JSON"),
    "vms not records": (json.dumps({"pid": 1, "emulation_id": "x", "vms": [7]}).encode(), "vms"),
}


def invoke(args: list[str], state_dir: Path | str):
    return CliRunner().invoke(app, args, env={"MULTISLICE_STATE_DIR": str(state_dir), "COLUMNS": "250"}, color=False)


def refusal(result) -> str:
    """The one ``error:`` line of a refused command (exit 2, nothing else printed)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception)  # SystemExit: an exit
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def unusable_state_dirs(tmp_path: Path) -> dict[str, tuple[Path | str, str]]:
    """Each state directory that cannot be one, and the path the refusal names as not a directory."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    return {
        "a file": (a_file, str(a_file)),
        "under a file": (a_file / "state", str(a_file)),
        "/dev/null": ("/dev/null", "/dev/null"),
        "under /dev/null": ("/dev/null/state", "/dev/null"),
    }


@pytest.mark.parametrize("which", ["a file", "under a file", "/dev/null", "under /dev/null"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_state_directory_that_cannot_be_one_is_refused(tmp_path, command, which):
    state_dir, culprit = unusable_state_dirs(tmp_path)[which]
    line = refusal(invoke(COMMANDS[command], state_dir))
    assert "the local state directory" in line and f"{culprit} is not a directory" in line, line
    assert "MULTISLICE_STATE_DIR" in line


@pytest.mark.parametrize("command", ["status", "exec", "reset", "down --stack"])
def test_a_stack_directory_that_is_a_file_is_refused(tmp_path, command):
    (tmp_path / "dev").write_text("not a directory\n")
    line = refusal(invoke(COMMANDS[command], tmp_path))
    assert f"{tmp_path / 'dev'} is not a directory" in line and "MULTISLICE_STATE_DIR" in line


def damage(tmp_path: Path, content: bytes) -> Path:
    (tmp_path / "dev").mkdir()
    state_file = tmp_path / "dev" / "emulator.json"
    state_file.write_bytes(content)
    return state_file


@pytest.mark.parametrize("kind", sorted(DAMAGED))
@pytest.mark.parametrize("command", ["status", "exec", "reset", "up"])
def test_a_damaged_state_file_is_named_with_what_to_do(tmp_path, command, kind):
    content, why = DAMAGED[kind]
    state_file = damage(tmp_path, content)
    # --timeout: were the refusal ever lost, `local up` would give up at once, not train.
    args = ["local", "up", "--timeout", "1", "--stall-timeout", "1"] if command == "up" else COMMANDS[command]
    line = refusal(invoke(args, tmp_path))
    assert f"{state_file} is damaged" in line and why in line, line
    assert "multislice local down --stack dev" in line
    assert state_file.read_bytes() == content  # kept: only `local down` removes it


@pytest.mark.parametrize("kind", sorted(DAMAGED))
@pytest.mark.parametrize("stack", [None, "dev"])
def test_down_removes_a_damaged_state_file_that_no_run_holds(tmp_path, kind, stack):
    content, why = DAMAGED[kind]
    state_file = damage(tmp_path, content)
    result = invoke(["local", "down", *(["--stack", stack] if stack else [])], tmp_path)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert f"dev: removed the damaged state file {state_file} (" in text and why in text, text
    assert not state_file.exists()
    assert invoke(["local", "down"], tmp_path).output.strip() == "no local run is running"


def test_down_keeps_a_damaged_state_file_while_a_run_holds_the_lock(tmp_path):
    state_file = damage(tmp_path, b"[]")
    lock = state_lib.acquire_lock(LocalPaths(tmp_path / "dev"))  # a `local up` of the stack
    assert lock is not None
    try:
        line = refusal(invoke(COMMANDS["down --stack"], tmp_path))
    finally:
        lock.close()
    assert f"{state_file} is damaged" in line and "holds its lock" in line, line
    assert state_file.exists()
