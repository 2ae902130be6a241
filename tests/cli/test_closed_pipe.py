"""Every command survives its reader going away (``multislice plan | head -1``): exit 0, or the
command's own status, and no traceback, whatever it prints and however much.

Each command runs as a process whose standard output is a pipe with its read end already closed:
what ``head -1`` leaves once it has its line, without the race of a small output that fits the
pipe's buffer before ``head`` exits. Every command of the tree is run with ``--help`` (rich's
help); those that print offline (the review commands, the local group, ``bench``'s JSON through
typer's echo) run for real. The deployed-stack commands (``status``, ``logs``, ``exec``, ``reset``)
need credentials and the cloud, and run only with ``--help`` here: they print through the same
console (infra.cli.options.ClosedPipeGroup handles every command alike).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer.main

from infra.cli import app
from tests.helpers.emulation import cli_env

ROOT = Path(__file__).resolve().parents[2]


def command_paths() -> list[list[str]]:
    """Every command of the CLI as the words that name it (``["local", "up"]``), groups included."""
    found: list[list[str]] = [[]]

    def walk(command, words):
        if hasattr(command, "list_commands"):  # a group (typer's click: no isinstance)
            ctx = command.context_class(command, info_name="multislice")
            for name in command.list_commands(ctx):
                found.append([*words, name])
                walk(command.get_command(ctx, name), [*words, name])

    walk(typer.main.get_command(app), [])
    return found


def into_closed_pipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first byte
    try:
        return subprocess.run(
            [sys.executable, "-m", "infra.cli", *args],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            timeout=240,
        )
    finally:
        os.close(write)


def big_console_log(state: Path) -> None:
    """A stopped run's console log of 20,000 trainer lines (``local logs`` reads it)."""
    logs = state / "dev" / "logs"
    logs.mkdir(parents=True)
    lines = (
        f"2026-12-06T10:00:{i % 60:02d}+0000 INFO training.loop: step {i} loss 2.5 tokens/s 1000\n"
        for i in range(20_000)
    )
    (logs / "slice-0-worker-0.log").write_text("".join(lines))


#: (arguments, the command's own exit status: what it exits with when its output is read).
PRINTING = [
    (["plan", "--stack", "dev"], 0),
    (["plan", "--stack", "dev", "--json"], 0),
    (["render", "--stack", "dev"], 0),
    (["render", "--stack", "dev", "--config"], 0),
    (["check", "--stack", "dev"], 0),
    (["diff", "--stack", "dev", "--against", "HEAD"], 0),
    (["local", "status", "--stack", "dev"], 0),
    (["local", "status", "--stack", "dev", "--json"], 0),
    (["local", "logs", "--stack", "dev"], 0),
    (["local", "down"], 0),
    (["local", "exec", "--stack", "dev", "--", "true"], 2),  # no run: the error line, on stderr
    (["local", "reset", "--stack", "dev", "--yes"], 2),
]


def test_every_command_survives_a_closed_pipe(tmp_path):
    env = cli_env(tmp_path / "state")
    big_console_log(tmp_path / "state")
    runs = [([*words, "--help"], 0) for words in command_paths()] + PRINTING
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda run: into_closed_pipe(run[0], env), runs))
    problems = []
    for (args, status), result in zip(runs, results, strict=True):
        if result.returncode != status or "Traceback" in result.stderr or "BrokenPipe" in result.stderr:
            problems.append(f"{' '.join(args)}: exit {result.returncode} (expected {status})\n{result.stderr[-2000:]}")
    assert not problems, "\n".join(problems)
    assert len(runs) > 30  # every command of the tree was found


def test_output_that_is_read_is_unchanged_and_complete(tmp_path):
    """The same command with a reader prints every line: the closed pipe's handling cuts nothing short."""
    env = cli_env(tmp_path / "state")
    big_console_log(tmp_path / "state")
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "local", "logs", "--stack", "dev"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("training.loop: step") == 20_000
