"""A documented ``uv run … multislice …`` run outside the repository, as the README says: from the
directory above a clone named ``multislice``, uv finds no project there and runs the clone's
directory as a Python program with another interpreter (no pulumi); the repository's
``__main__.py`` then prints one line naming the repository and the ``--project`` form, exit 2,
instead of a traceback. Anywhere else uv finds no ``multislice`` to run (tests/test_readme.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_run_as_a_program_without_pulumi_says_how_to_run_the_cli(tmp_path):
    clone = tmp_path / "multislice"
    clone.symlink_to(ROOT)
    # -S: no site-packages, so no pulumi, as with the Python uv picks outside any project.
    result = subprocess.run(
        [sys.executable, "-S", "multislice", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"error: {ROOT} is the multislice repository (its Pulumi program runs under `pulumi up`); run the CLI "
        f"from there with `uv run --frozen multislice …`, or from anywhere with "
        f"`uv run --project {ROOT} --frozen multislice …`\n"
    )
    assert result.stdout == ""
