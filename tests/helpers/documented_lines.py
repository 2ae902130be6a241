"""Command lines of the README and docs run exactly as written: each through ``bash -c`` in the
repository, ``~`` a temporary home, ``uv`` the set-up's (the README's ``alias uv=…``), the
emulations' state and the session's compilation cache in the environment
(:func:`tests.helpers.emulation.cli_env`), never in the line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.emulation import cli_env

ROOT = Path(__file__).resolve().parents[2]


def uv_binary() -> str:
    """The set-up's uv (the README's alias), else the one uv.lock pins in the project's .venv."""
    for candidate in (ROOT / ".venv-uv" / "bin" / "uv", Path(sys.prefix) / "bin" / "uv"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("uv")
    assert found, "no uv: the README's set-up installs one"
    return found


def shell_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The shell's environment: ``~`` is ``tmp_path/home``, ``uv`` on PATH is the set-up's, the
    emulations' state under ``tmp_path/state``; ``extra`` added."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    (bin_dir / "uv").symlink_to(uv_binary())
    return cli_env(tmp_path / "state") | {
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        # uv's cache and Pythons stay the user's: the set-up already filled them.
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")),
        "UV_PYTHON_INSTALL_DIR": os.environ.get(
            "UV_PYTHON_INSTALL_DIR", str(Path.home() / ".local" / "share" / "uv" / "python")
        ),
        **extra,
    }


def shell(line: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``line`` through ``bash -c`` in the repository."""
    return subprocess.run(
        ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


class Lines:
    """Runs documented lines (:func:`shell`) in one environment and keeps every output, so that
    the test can then check the hints they printed (:meth:`check_hints`)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.outputs: list[str] = []

    def __call__(self, line: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = shell(line, self.env, timeout)
        self.outputs.append(done.stdout + done.stderr)
        return done

    def check_hints(self, monkeypatch, minimum: int) -> list[list[str]]:
        """Every hint in the outputs works as printed: each starts with the invocation the user
        typed (``uv run --frozen multislice``: ``uv`` is on this shell's PATH), parses and resolves
        its stack (:func:`tests.helpers.hints.works_as_printed`, a ``--stack`` resolved through this
        environment's state directory), and each that only reads (:data:`READING_HINTS`) is run
        through bash exactly as printed and exits 0; at least ``minimum`` hints."""
        from tests.helpers.hints import hints, printed, works_as_printed

        monkeypatch.setenv("MULTISLICE_STATE_DIR", self.env["MULTISLICE_STATE_DIR"])
        lines = [line for output in self.outputs for line in printed(output)]
        found = [h for output in self.outputs for h in hints(output)]
        assert len(found) >= minimum, self.outputs
        bare = [
            text
            for output in self.outputs
            for text in output.splitlines()
            if any(not line.startswith("uv run --frozen multislice ") and line in text for line in printed(text))
        ]
        assert not bare, bare  # each hint names the invocation that reached the CLI
        for args in found:
            works_as_printed(args)
        for line, args in dict(zip(lines, found, strict=True)).items():
            if tuple(args[:2]) in READING_HINTS or args[:1] == ["plan"]:
                ran = shell(line, self.env)
                assert ran.returncode == 0, (line, ran.stdout + ran.stderr)
        return found


#: The hints that only read (a run's logs or status), run by :meth:`Lines.check_hints`; the others
#: start or stop runs, and are parsed and resolved only.
READING_HINTS = {("local", "logs"), ("local", "status")}
