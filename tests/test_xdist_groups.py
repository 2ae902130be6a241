"""The suite's parallel run keeps a module's shared fixture to one run (tests/xdist_groups.py).

A small suite in a temporary directory, run by this pytest and pytest-xdist with two workers
as the project's addopts do: a module whose tests share a module-scoped fixture, next to
modules of plain tests. The fixture must be set up once, by one worker, while the plain tests
still spread over both workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHARED = """
import os, time, pytest

@pytest.fixture(scope="module")
def run(worker_id):
    with open(os.environ["SETUP_LOG"], "a") as log:
        log.write(f"{worker_id}\\n")
    return 1

@pytest.mark.parametrize("i", range(6))
def test_reads_the_run(run, i):
    time.sleep(0.05)
"""

PLAIN = """
import os, time, pytest

@pytest.mark.parametrize("i", range(8))
def test_plain(worker_id, i):
    time.sleep(0.1)
    with open(os.environ["PLAIN_LOG"], "a") as log:
        log.write(f"{worker_id}\\n")
"""


def test_a_module_scoped_fixture_runs_once_and_plain_tests_spread(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # not the project's addopts
    (suite / "test_shared.py").write_text(SHARED)
    (suite / "test_plain_a.py").write_text(PLAIN)
    (suite / "test_plain_b.py").write_text(PLAIN)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SETUP_LOG": str(tmp_path / "setups"),
        "PLAIN_LOG": str(tmp_path / "plain"),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.xdist_groups",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            str(suite),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "22 passed" in result.stdout
    setups = (tmp_path / "setups").read_text().split()
    assert len(setups) == 1, f"the module's fixture was set up by {setups}"
    assert set((tmp_path / "plain").read_text().split()) == {"gw0", "gw1"}
