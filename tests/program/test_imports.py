"""What evaluating the Pulumi program imports (issue: preview in seconds): only what it
declares or computes with. No jax, orbax or other trainer runtime (the planner's arithmetic
reads ``training.model.shapes``), and no Google API client (only the provider's API methods use one).
One fresh process evaluates every stack in turn, the way ``pulumi preview`` runs the program,
and reports the modules loaded after each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import available_stacks

ROOT = Path(__file__).resolve().parents[2]

#: Top-level packages of the trainer's runtime (and what they pull in).
TRAINER_RUNTIME = ("jax", "jaxlib", "orbax", "optax", "grain", "numpy", "tensorboardX", "etils", "tensorstore")
#: The jax-free modules of training/ the program reads (config, its validation, the shapes, the
#: model presets and the attention kernels' limits that the config validates against, and the one
#: redaction of values its messages quote, the elastic slice-count rule ``multislice:elastic`` is
#: checked against, the one wording of its warnings), and the package they are in (its __init__
#: holds only a docstring).
PURE_TRAINING = {
    "training",
    "training.model",
    "training.config",
    "training.model.config",
    "training.validation",
    "training.model.shapes",
    "training.model.presets",
    "training.model.kernels",
    "training.redaction",
    "training.elastic",
    "training.warning_text",
}
GOOGLE_CLIENTS = ("google.cloud", "google.api_core", "google.auth")

CHILD = """
import json, sys
from tests.fakes import pulumi_program
report = {}
for stack in sys.argv[1:]:
    world = pulumi_program.evaluate(stack, preview=True, as_main=True)
    report[stack] = {"registrations": len(world.registrations), "modules": sorted(sys.modules)}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def evaluated() -> dict[str, dict]:
    """stack -> registrations and the modules loaded once it was evaluated (one process)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *available_stacks()], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stack", available_stacks())
def test_evaluation_imports_no_trainer_runtime_and_no_google_client(evaluated, stack):
    registrations, modules = evaluated[stack]["registrations"], evaluated[stack]["modules"]
    assert registrations > 20  # the whole environment was declared
    assert "infra.planner" in modules and "training.model.shapes" in modules  # the planner ran
    assert [m for m in modules if m.split(".")[0] in TRAINER_RUNTIME] == []
    assert sorted(m for m in modules if m.split(".")[0] == "training" and m not in PURE_TRAINING) == []
    assert [m for m in modules if m.startswith(GOOGLE_CLIENTS)] == []


@pytest.mark.parametrize(
    "change, key",
    [
        ({"multislice:slices": 0}, "multislice:slices"),
        ({"multislice:acceleratorType": "v4-7"}, "multislice:acceleratorType"),
        ({"multislice:capacity": "best-effort"}, "multislice:capacity"),
        ({"multislice:training": {"model": {"d_model": 30, "n_heads": 4}}}, "multislice:training.model.n_heads"),
    ],
)
def test_a_preview_still_names_the_bad_key_before_any_resource(monkeypatch, change, key):
    # Nothing the program computes lazily defers a validation to `pulumi up`: a preview fails
    # on the bad key with nothing registered.
    from infra.config import StackConfigError
    from tests.fakes import pulumi_program

    worlds = []
    start = pulumi_program._start
    monkeypatch.setattr(pulumi_program, "_start", lambda *args: worlds.append(start(*args)) or worlds[-1])
    with pytest.raises(StackConfigError) as err:
        pulumi_program.evaluate("dev", {**pulumi_program.stack_map("dev"), **change}, preview=True)
    assert any(line.startswith(f"{key}:") for line in err.value.lines), err.value.lines
    assert len(worlds) == 1 and worlds[0].registrations == []
