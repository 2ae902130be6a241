"""Direct references in a workload's requirements (infra/config/requirement_urls.py) and the hints
of every requirements refusal (infra/config/vm_python.py): a GitHub archive is accepted only for a
full commit or a tag, a branch's in either URL form is refused; and every message that says to
compile the file gives the whole command, with the VMs' Python version and platform."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, load_stack_file
from infra.config.vm_python import compile_command, read_python_version
from infra.config.workload import parse_requirements

ROOT = Path(__file__).resolve().parents[2]
HASH = "a" * 64
COMMIT = "29329e8e73820993f77cfc8efe34eb2a73f5de98"
BASE = {"gcp:project": "my-project-123", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}
#: The command docs/workloads.md gives, for this checkout's .python-version.
COMPILE = (
    f"uv pip compile requirements.in --generate-hashes --python-version {read_python_version(ROOT)} "
    "--python-platform x86_64-manylinux_2_35 -o requirements-vm.txt"
)
runner = CliRunner()


def refusal(line: str) -> str:
    with pytest.raises(ValueError) as err:
        parse_requirements(f"absl-py==2.1.0 --hash=sha256:{HASH}\n{line}\n")
    return str(err.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://github.com/o/r/archive/main.zip",
            "names 'main', a branch or a tag, which GitHub resolves when the archive is downloaded, and a branch "
            "changes with every push (its hash then stops matching and the VMs cannot install it): use the archive "
            "of a commit, …/archive/<40-hex commit>.zip, or write a tag as …/archive/refs/tags/main.zip",
        ),
        ("https://github.com/o/r/archive/release/2.x.tar.gz", "names 'release/2.x', a branch or a tag"),
        ("https://www.github.com/o/r/archive/v1.0.zip", "or write a tag as …/archive/refs/tags/v1.0.zip"),
        (
            "https://github.com/o/r/archive/29329e8.zip",
            "names '29329e8', an abbreviated commit or a branch of that name, which GitHub resolves when the archive "
            "is downloaded: write the full commit, …/archive/<40-hex commit>.zip",
        ),
        ("https://github.com/o/r/archive/refs/heads/main.zip", "is the archive of a branch, which changes"),
        ("https://codeload.github.com/o/r/zip/refs/heads/main", "is the archive of a branch, which changes"),
        ("https://codeload.github.com/o/r/tar.gz/main", "names 'main', a branch or a tag"),
    ],
    ids=[
        "short-branch",
        "slashed-branch",
        "www-tag-short",
        "abbreviated-commit",
        "refs-heads",
        "codeload-heads",
        "codeload",
    ],
)
def test_a_github_archive_of_a_name_is_refused(url, expected):
    message = refusal(f"pkg @ {url} --hash=sha256:{HASH}")
    assert message.startswith(f"line 2: 'pkg @ {url}' "), message
    assert expected in message, message


@pytest.mark.parametrize(
    "url",
    [
        f"https://github.com/o/r/archive/{COMMIT}.zip",
        f"https://github.com/o/r/archive/{COMMIT}.tar.gz",
        f"https://codeload.github.com/o/r/zip/{COMMIT}",
        "https://github.com/o/r/archive/refs/tags/v1.0.zip",
        "https://github.com/o/r/releases/download/v1.0/pkg-1.0.tar.gz",  # an uploaded asset, not an archive
        "https://example.com/archive/main.zip",  # another host: its URLs are its own
    ],
)
def test_a_github_archive_of_a_commit_or_tag_and_other_urls_are_accepted(url):
    (requirement,) = parse_requirements(f"pkg @ {url} --hash=sha256:{HASH}\n")
    assert requirement.url == url and requirement.line == 1


def test_cli_plan_refuses_a_short_branch_archive_with_exit_2(tmp_path):
    requirements = tmp_path / "req.txt"
    requirements.write_text(f"pkg @ https://github.com/o/r/archive/main.zip --hash=sha256:{HASH}\n")
    path = tmp_path / "stacks" / "Pulumi.wl.yaml"
    path.parent.mkdir()
    workload = {"command": ["x"], "steps": 1, "requirements": str(requirements)}
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload}}))
    result = runner.invoke(app, ["plan", "--config-file", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    lines = result.output.splitlines()
    assert lines[0] == f"error: stack 'wl' ({path}) is invalid:" and len(lines) == 2, lines
    assert lines[1].startswith(
        f"  multislice:workload.requirements: {requirements}: line 1: 'pkg @ https://github.com/o/r/archive/main.zip' "
        "names 'main', a branch or a tag"
    ), lines


# Every hint gives the whole command ---------------------------------------------------------------


def test_the_compile_command_is_the_one_the_docs_give():
    assert compile_command() == COMPILE
    docs = " ".join((ROOT / "docs" / "workloads.md").read_text().replace("\\\n", " ").split())
    assert compile_command("3.11") in docs


@pytest.mark.parametrize(
    "line",
    [
        # MaxText's requirements file, as its repository has it: unpinned names, then URL lines without hashes.
        "absl-py",
        f"google-jetstream @ https://github.com/AI-Hypercomputer/JetStream/archive/{COMMIT}.zip",
        f"google-jetstream @ git+https://github.com/AI-Hypercomputer/JetStream.git@{COMMIT}",
        "./vendor/pkg",
        "numpy>=2.0",
    ],
    ids=["unpinned", "url-without-hash", "git", "local-path", "range"],
)
def test_every_hint_to_compile_gives_the_vms_python_and_platform(tmp_path, line):
    message = refusal(line)
    assert "uv pip compile" in message
    assert f"`{COMPILE}`" in message, message
    requirements = tmp_path / "req.txt"
    requirements.write_text(line + "\n")
    path = tmp_path / "stacks" / "Pulumi.wl.yaml"
    path.parent.mkdir()
    workload = {"command": ["x"], "steps": 1, "requirements": str(requirements)}
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload}}))
    with pytest.raises(StackConfigError) as err:
        load_stack_file(path)
    (only,) = err.value.lines
    assert only.startswith(f"multislice:workload.requirements: {requirements}: line 1: ") and COMPILE in only
