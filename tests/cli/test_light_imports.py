"""Commands that do not train or evaluate the program import nothing heavy: no jax, orbax or
tensorstore (importing them takes seconds; benchmarks/cli_speed.py measures the commands)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli_imports import DRIVER, HEAVY

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"

LIGHT_COMMANDS = {
    "help": (["--help"], 0),
    "local up --help": (["local", "up", "--help"], 0),
    "local down, nothing running": (["local", "down"], 0),
    "local down --stack": (["local", "down", "--stack", "dev"], 0),
    "local down --stack typo": (["local", "down", "--stack", "no-such-stack"], 2),
    "--kill typo": (["local", "up", "--config-file", str(STACK), "--kill", "x"], 2),
    "--preempt out of range": (["local", "up", "--config-file", str(STACK), "--preempt", "9@1"], 2),
    "plan": (["plan", "--config-file", str(STACK)], 0),
    "plan --json": (["plan", "--config-file", str(STACK), "--json"], 0),
    "render": (["render", "--config-file", str(STACK)], 0),
    "render --config": (["render", "--config-file", str(STACK), "--config"], 0),
}


@pytest.mark.parametrize("name", list(LIGHT_COMMANDS))
def test_light_commands_import_no_jax_orbax_or_tensorstore(name, tmp_path):
    args, expected_code = LIGHT_COMMANDS[name]
    out = tmp_path / "modules.json"
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["code"] in (expected_code, None if expected_code == 0 else expected_code), proc.stdout + proc.stderr
    heavy = sorted(m for m in result["modules"] if m.split(".")[0] in HEAVY)
    assert heavy == [], f"{name} imported {heavy[:5]}"


def test_what_local_up_reads_before_its_vms_start_imports_nothing_heavy():
    # `local up` reads the run directory (complete? its summary) in its own process, each time it
    # runs: with orbax (and jax) imported for it, that cost a second or more of CPU a run.
    modules = (
        "infra.local.lifecycle",
        "infra.local.emulated_stack",
        "infra.emulated.state",
        "infra.local.summary",
        "training.checkpoint.completion",
    )
    code = f"import json, sys\nimport {', '.join(modules)}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    heavy = sorted(m for m in json.loads(proc.stdout) if m.split(".")[0] in HEAVY)
    assert heavy == [], heavy[:5]
