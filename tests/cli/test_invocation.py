"""A printed command starts with the invocation that reaches the CLI from the user's shell
(infra/invocation.py): ``uv run --frozen multislice`` under ``uv run``, ``multislice`` on PATH, the
script's path as typed, ``python -m infra.cli``; and a hint printed under ``uv run`` runs as printed."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from infra import invocation
from tests.helpers.documented_lines import shell, shell_env

ROOT = Path(__file__).resolve().parents[2]


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_process_that_is_not_the_cli_prints_the_plain_name(tmp_path):
    # A test runner, the Pulumi engine's program: even under uv run, nothing says how the user typed it.
    environ = {"UV_RUN_RECURSION_DEPTH": "1", "UV": str(executable(tmp_path / "uv")), "PATH": ""}
    assert invocation.invocation("/somewhere/bin/pytest", environ) == "multislice"
    assert invocation.invocation("/usr/bin/pulumi-language-python-exec", {}) == "multislice"


def test_the_script_on_path_is_its_name_and_elsewhere_its_path_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = executable(tmp_path / "venv" / "bin" / "multislice")
    on_path = {"PATH": f"/nowhere{os.pathsep}{script.parent}"}
    assert invocation.invocation(str(script), on_path) == "multislice"
    assert invocation.invocation("venv/bin/multislice", {"PATH": "/usr/bin"}) == "venv/bin/multislice"
    other = executable(tmp_path / "other" / "multislice")  # PATH finds another script of that name
    assert invocation.invocation(str(script), {"PATH": str(other.parent)}) == str(script)
    spaced = executable(tmp_path / "my venv" / "multislice")
    assert invocation.invocation(str(spaced), {"PATH": "/usr/bin"}) == shlex.quote(str(spaced))


def test_python_dash_m_is_printed_with_the_interpreter():
    import sys

    argv0 = str(ROOT / "infra" / "cli" / "__main__.py")
    assert invocation.invocation(argv0, {}) == f"{shlex.quote(sys.executable)} -m infra.cli"


def test_under_uv_run_the_uv_that_ran_it(tmp_path, monkeypatch):
    """``uv`` when the user's PATH finds the uv that ran (not the project's own, which ``uv run``
    put first), else its path; ``--project`` when the directory is outside the checkout."""
    script = str(ROOT / ".venv" / "bin" / "multislice")
    uv = executable(tmp_path / "tools" / "uv")
    monkeypatch.chdir(ROOT)
    venv = executable(tmp_path / "venv" / "bin" / "uv").parent.parent  # the project's own uv, first
    on_path = {"UV_RUN_RECURSION_DEPTH": "1", "UV": str(uv), "VIRTUAL_ENV": str(venv)}
    on_path["PATH"] = f"{venv / 'bin'}{os.pathsep}{uv.parent}"
    assert invocation.invocation(script, on_path, str(uv)) == "uv run --frozen multislice"
    on_path["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin"  # uv not on the user's PATH: its path
    assert invocation.invocation(script, on_path, None) == f"{uv} run --frozen multislice"
    monkeypatch.chdir(tmp_path)  # below the cwd: relative; and outside the checkout: --project
    assert invocation.invocation(script, on_path, str(uv)) == f"tools/uv run --frozen --project {ROOT} multislice"
    monkeypatch.chdir(ROOT / "docs")  # below the checkout: uv finds the project
    assert invocation.invocation(script, on_path, str(uv)) == f"{uv} run --frozen multislice"


def test_a_process_below_uv_run_that_uv_did_not_start_is_not_under_uv_run(tmp_path):
    """uv's variables pass on to every process below it (``uv run pytest`` starting ``python -m
    infra.cli``): where the parent can be read, only uv's own child prints ``uv run``."""
    uv = executable(tmp_path / "tools" / "uv")
    environ = {"UV_RUN_RECURSION_DEPTH": "1", "UV": str(uv), "PATH": ""}
    argv0 = str(ROOT / "infra" / "cli" / "__main__.py")
    import sys

    assert invocation.invocation(argv0, environ, sys.executable) == f"{shlex.quote(sys.executable)} -m infra.cli"
    assert invocation.invocation(argv0, environ, str(uv)).endswith("run --frozen multislice")
    assert invocation.invocation(argv0, environ, None).endswith("run --frozen multislice")  # cannot tell


def test_a_hint_printed_under_uv_run_runs_as_printed(tmp_path):
    """The README's way in: ``uv run --frozen multislice …``. The hint names uv as the shell finds
    it, and the invocation it printed reaches the CLI through bash in the same directory."""
    env = shell_env(tmp_path)
    result = shell("uv run --frozen multislice local logs --stack dev", env, timeout=240)
    assert result.returncode == 1, result.stderr
    (hint,) = re.findall(r"start it with: (.*)\)$", result.stderr.strip())
    assert hint == "uv run --frozen multislice local up --stack dev", result.stderr
    status = shell(hint.replace(" local up ", " local status "), env, timeout=240)
    # It reached the CLI: the stack's status, and exit 1 as local status ends when no run exists yet.
    assert status.returncode == 1 and "stack dev: not running" in status.stdout, status.stderr
    assert "no run in gs://" in status.stderr


@pytest.mark.parametrize("words", [("local up", "dev", "--fresh"), ("plan", None, "")])
def test_command_puts_the_stack_between_the_words_and_the_rest(words):
    line = invocation.command(*words)
    expected = " ".join(part for part in ("multislice", words[0], words[1] and f"--stack {words[1]}", words[2]) if part)
    assert line == expected
