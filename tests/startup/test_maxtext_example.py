"""The MaxText stack of docs/workloads.md ("Worked example") validates and renders a release
against a stand-in MaxText checkout whose requirements end as MaxText's do (the page's URL
lines, hashed as ``uv pip compile --generate-hashes`` writes them), its command line expands the
run directory into MaxText's run_name / base_output_directory as the page says, and the page
names one MaxText commit throughout."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config.loading import load_stack_file
from infra.config.workload import parse_requirements
from infra.startup import lockfile, workload as workload_release
from infra.startup.release import workload_files
from infra.startup.uv_lock import Lock

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "workloads.md"


def example() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index("## Worked example") :]


def example_stack() -> str:
    """The yaml block that follows "**The stack**" in the worked example."""
    section = example()
    section = section[section.index("**The stack**") :]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def maxtext_url_lines() -> list[str]:
    """The last lines of MaxText's requirements file, as the worked example quotes them."""
    section = example()
    section = section[section.index("ends in two URL requirements") :]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    return block.splitlines()


def hashed(lines: list[str]) -> str:
    """The lines as `uv pip compile --generate-hashes` writes them (a stand-in hash each)."""
    return "".join(f"{line} \\\n    --hash=sha256:{index:064x}\n" for index, line in enumerate(lines, start=1))


def checkout(tmp_path: Path) -> Path:
    """A project with the page's stack file, and a stand-in MaxText checkout beside it."""
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    (project / "stacks" / "Pulumi.maxtext.yaml").write_text(example_stack())
    package = tmp_path / "maxtext" / "src" / "maxtext"
    (package / "configs").mkdir(parents=True)
    (package / "trainers" / "pre_train").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "trainers" / "pre_train" / "train.py").write_text("print('stand-in')\n")
    (package / "configs" / "base.yml").write_text("run_name: ''\n")
    (tmp_path / "maxtext" / "requirements-vm.txt").write_text(
        "# uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_35\n"
        "maxtext-stand-in-dependency==1.0 --hash=sha256:" + "0" * 64 + "\n" + hashed(maxtext_url_lines())
    )
    return project


def test_maxtexts_url_requirements_pass_the_check_once_hashed():
    lines = maxtext_url_lines()
    assert [line.split(" @ ")[0] for line in lines] == ["google-jetstream", "mlperf-logging"]
    assert all(re.fullmatch(r"\S+ @ https://github\.com/\S+/archive/[0-9a-f]{40}\.zip", line) for line in lines)
    with pytest.raises(ValueError, match=r"line 1: 'google-jetstream @ https://.*' has no --hash=sha256:"):
        parse_requirements("\n".join(lines) + "\n")  # as MaxText's file has them: uv pip compile adds the hashes
    text = hashed(lines)
    assert [(r.name, r.url) for r in parse_requirements(text)] == [tuple(line.split(" @ ")) for line in lines]
    workload_release.check_requirements(text, lockfile.install_target(ROOT), Lock(ROOT / "uv.lock"))


def test_the_worked_example_stack_validates_and_ships_maxtext(tmp_path):
    project = checkout(tmp_path)
    config = load_stack_file(project / "stacks" / "Pulumi.maxtext.yaml")
    assert config.workload is not None and config.slices == 2 and config.network.iap_ssh
    release = workload_files(config, ROOT)
    assert release is not None
    spec = json.loads(release.files["workload.json"])
    assert spec["steps"] == 20000 and spec["command"][:2] == ["bash", "-c"]
    assert "workload-requirements.txt" in release.files and release.requirements_sha256
    assert release.files["workload-requirements.txt"] == (tmp_path / "maxtext" / "requirements-vm.txt").read_bytes()
    assert "workload/maxtext/trainers/pre_train/train.py" in release.files


def test_the_command_line_splits_the_run_directory_for_maxtext(tmp_path):
    stack = yaml.safe_load(example_stack())["config"]["multislice:workload"]
    line = stack["command"][2].replace("exec python3", "exec echo python3", 1)  # print, do not run
    env = {"PATH": "/usr/bin:/bin", "MULTISLICE_RUN_DIR": "gs://acme-ckpt/runs/maxtext", "MULTISLICE_NUM_SLICES": "2"}
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[:4] == ["python3", "-m", "maxtext.trainers.pre_train.train", "maxtext/configs/base.yml"]
    assert {"run_name=maxtext", "base_output_directory=gs://acme-ckpt/runs", "dcn_data_parallelism=2"} <= set(out)
    # MaxText's checkpoints (<base>/<run_name>/checkpoints) are the contract's MULTISLICE_CHECKPOINT_DIR.
    assert "steps=20000" in out


def test_the_example_names_one_maxtext_commit():
    section = example()
    (commit,) = re.findall(r"git -C \.\./maxtext checkout ([0-9a-f]{40})", section)
    page = PAGE.read_text(encoding="utf-8")
    pinned = set(re.findall(r"github(?:usercontent)?\.com/AI-Hypercomputer/maxtext/(?:blob/)?([0-9a-f]{40})/", page))
    assert pinned == {commit}
    assert f"maxtext/{commit}/src/maxtext/examples/shardings.py" in section  # where MaxText keeps it now
