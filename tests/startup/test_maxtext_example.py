"""The MaxText stack of docs/workloads.md ("Worked example") validates and renders a release
against a stand-in MaxText checkout, and its command line expands the run directory into
MaxText's run_name / base_output_directory as the page says."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from infra.config.loading import load_stack_file
from infra.startup import script

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "workloads.md"


def example_stack() -> str:
    """The yaml block that follows "**The stack**" in the worked example."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Worked example") :]
    section = section[section.index("**The stack**") :]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def checkout(tmp_path: Path) -> Path:
    """A project with the page's stack file, and a stand-in MaxText checkout beside it."""
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    (project / "stacks" / "Pulumi.maxtext.yaml").write_text(example_stack())
    package = tmp_path / "maxtext" / "src" / "MaxText"
    (package / "configs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("print('stand-in')\n")
    (package / "configs" / "base.yml").write_text("run_name: ''\n")
    (tmp_path / "maxtext" / "requirements-vm.txt").write_text(
        "# uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_35\n"
        "maxtext-stand-in-dependency==1.0 --hash=sha256:" + "0" * 64 + "\n"
    )
    return project


def test_the_worked_example_stack_validates_and_ships_maxtext(tmp_path):
    project = checkout(tmp_path)
    config = load_stack_file(project / "stacks" / "Pulumi.maxtext.yaml")
    assert config.workload is not None and config.slices == 2 and config.network.iap_ssh
    release = script.workload_files(config, ROOT)
    assert release is not None
    spec = json.loads(release.files["workload.json"])
    assert spec["steps"] == 20000 and spec["command"][:2] == ["bash", "-c"]
    assert "workload-requirements.txt" in release.files and release.requirements_sha256


def test_the_command_line_splits_the_run_directory_for_maxtext(tmp_path):
    stack = yaml.safe_load(example_stack())["config"]["multislice:workload"]
    line = stack["command"][2].replace("exec python3", "exec echo python3", 1)  # print, do not run
    env = {"PATH": "/usr/bin:/bin", "MULTISLICE_RUN_DIR": "gs://acme-ckpt/runs/maxtext", "MULTISLICE_NUM_SLICES": "2"}
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[:3] == ["python3", "-m", "MaxText.train"]
    assert {"run_name=maxtext", "base_output_directory=gs://acme-ckpt/runs", "dcn_data_parallelism=2"} <= set(out)
    # MaxText's checkpoints (<base>/<run_name>/checkpoints) are the contract's MULTISLICE_CHECKPOINT_DIR.
    assert "steps=20000" in out
