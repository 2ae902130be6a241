"""Commands import only what they use. Those that neither train nor evaluate the program import no
Pulumi, no JAX (nor orbax or tensorstore) and no Google client library (``google.cloud.*``);
``check`` and ``diff``, which evaluate the program, import Pulumi and pulumi-gcp and still none of
the others. Importing them takes seconds, and ``status`` and ``local logs`` run in watch loops
(benchmarks/cli_speed.py times the commands, docs/development.md "Measured" has the figures). A
failure names each package and the modules whose imports first brought it in. Only what is
imported is checked, never how long it takes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack_file
from tests.fakes.queued_resource import clear_ambient_credentials, props_for, provider_for
from tests.fakes.synthetic_run import SyntheticRun, upload
from tests.fakes.tpu_api import FakeTpuApi
from tests.helpers.cli_imports import DRIVER, HEAVY, hermetic_env, unused_imports

ROOT = Path(__file__).parents[2]
STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
#: What the commands that evaluate the program use.
PROGRAM = ("pulumi", "pulumi_gcp", "pulumi_policy")

#: name → (argv, exit status, the packages of UNUSED it uses).
COMMANDS: dict[str, tuple[list[str], int, tuple[str, ...]]] = {
    "help": (["--help"], 0, ()),
    "local up --help": (["local", "up", "--help"], 0, ()),
    "local down, nothing running": (["local", "down"], 0, ()),
    "local down --stack": (["local", "down", "--stack", "dev"], 0, ()),
    "local down --stack typo": (["local", "down", "--stack", "no-such-stack"], 2, ()),
    "--kill typo": (["local", "up", "--config-file", str(STACK), "--kill", "x"], 2, ()),
    "--preempt out of range": (["local", "up", "--config-file", str(STACK), "--preempt", "9@1"], 2, ()),
    "plan": (["plan", "--stack", "dev"], 0, ()),
    "plan --json": (["plan", "--stack", "dev", "--json"], 0, ()),
    "render": (["render", "--stack", "dev"], 0, ()),
    "render --config": (["render", "--stack", "dev", "--config"], 0, ()),
    "local status, nothing run": (["local", "status", "--stack", "dev"], 1, ()),
    "local logs, nothing run": (["local", "logs", "--stack", "dev"], 1, ()),
    "check": (["check", "--stack", "dev"], 0, PROGRAM),
}


def imports_of(args: list[str], env: dict[str, str], cwd: Path, tmp_path: Path) -> tuple[int | None, dict, str]:
    """``multislice ARGS`` in a fresh interpreter: its exit status, what it imported
    (:data:`tests.helpers.cli_imports.DRIVER`) and its output."""
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    return result["code"], result, proc.stdout + proc.stderr


def check_imports(name: str, result: dict, uses: tuple[str, ...]) -> None:
    unused = unused_imports(result, allowed=uses)
    assert unused == {}, f"{name} imported what it does not use: " + "; ".join(
        f"{package}, first imported by {chain}" for package, chain in unused.items()
    )


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_imports_only_what_it_uses(name, tmp_path):
    args, expected_code, uses = COMMANDS[name]
    code, result, output = imports_of(args, hermetic_env(tmp_path, ROOT / "stacks"), ROOT, tmp_path)
    assert code in (expected_code, None if expected_code == 0 else expected_code), output
    check_imports(name, result, uses)


def test_diff_imports_the_program_and_nothing_else_heavy(tmp_path):
    # The working tree against HEAD: its stacks/ are the checkout's (the revision is read there).
    code, result, output = imports_of(
        ["diff", "--stack", "dev", "--against", "HEAD"], hermetic_env(tmp_path), ROOT, tmp_path
    )
    assert code in (0, None), output
    check_imports("diff", result, PROGRAM)


def test_status_of_a_deployed_stack_imports_no_client_library(tmp_path, bucket, monkeypatch):
    """The emu stack's queued resource ACTIVE in the loopback TPU API fake and a run in its bucket
    on the session's emulated Cloud Storage (as tests/cli/test_status.py deploys it): ``status``
    reads both over ``requests``, without ``google.cloud``."""
    clear_ambient_credentials(monkeypatch, tmp_path)
    document = yaml.safe_load(STACK.read_text())
    document["config"]["multislice:bucket"] = {"name": bucket}
    stack = tmp_path / "Pulumi.emu.yaml"
    stack.write_text(yaml.safe_dump(document))
    config = load_stack_file(stack)
    upload(config.run_dir, SyntheticRun(total_steps=24, steps_done=18, log_every=2, checkpoint_every=6).objects())
    with FakeTpuApi() as fake:
        monkeypatch.setenv("MULTISLICE_TPU_API_ENDPOINT", fake.endpoint)
        provider_for(fake).create(props_for(config))
        env = hermetic_env(tmp_path)
        code, result, output = imports_of(["status", "--config-file", str(stack), "--json"], env, ROOT, tmp_path)
    assert code in (0, None), output
    assert json.loads(output.splitlines()[0])["run"]["step"] == 18
    check_imports("status", result, ())


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
