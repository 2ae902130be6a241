"""multislice:workload (infra/config/workload.py): a stack's own command; each bad input is one
line naming its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, load_stack_file, validate_stack, workload as workload_config
from infra.config.workload import PinnedRequirement

HASH = "a" * 64
BASE = {"gcp:project": "my-project-123", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}


def stack_file(tmp_path: Path, workload: dict, **extra) -> Path:
    path = tmp_path / "stacks" / "Pulumi.wl.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload, **extra}}))
    return path


def error_lines(tmp_path: Path, workload: dict, **extra) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        load_stack_file(stack_file(tmp_path, workload, **extra))
    return err.value.lines


def test_a_command_with_source_relative_to_the_stack_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "req.txt").write_text(f"numpy==2.0.0 \\\n    --hash=sha256:{HASH}\n")
    config = load_stack_file(
        stack_file(
            tmp_path,
            {
                "command": ["python3", "train.py"],
                "steps": 10,
                "source": "../src",
                "requirements": "../req.txt",
                "env": {"A": 1, "B": "x"},
            },
        )
    )
    assert config.workload is not None
    assert config.workload.source == tmp_path / "src" and config.workload.requirements == tmp_path / "req.txt"
    assert config.workload.env == {"A": "1", "B": "x"} and config.total_steps == 10
    # The trainer's mesh checks do not apply to a command (no multislice:training here).
    assert config.workload.description() == {
        "command": ["python3", "train.py"],
        "env": {"A": "1", "B": "x"},
        "steps": 10,
    }


def test_the_pulumi_config_map_reads_the_same_model(tmp_path, monkeypatch):
    (tmp_path / "stacks" / "src").mkdir(parents=True)
    path = stack_file(tmp_path, {"command": ["x"], "steps": 1, "source": "src"})
    from_file = load_stack_file(path)
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(tmp_path / "stacks"))
    engine = {
        k: (v if isinstance(v, str) else __import__("json").dumps(v))
        for k, v in yaml.safe_load(path.read_text())["config"].items()
    }
    assert validate_stack("wl", engine, "pulumi config") == from_file


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        (
            {"command": "python3 train.py", "steps": 1},
            "multislice:workload.command: 'python3 train.py' is not a list of strings",
        ),
        ({"command": [], "steps": 1}, "multislice:workload.command: is empty"),
        ({"command": ["python3", 3], "steps": 1}, "multislice:workload.command: item 1 (3) is not a string"),
        ({"command": ["x"]}, "multislice:workload.steps:"),
        ({"command": ["x"], "steps": 0}, "multislice:workload.steps:"),
        ({"command": ["x"], "steps": 1, "source": "missing"}, "multislice:workload.source: "),
        ({"command": ["x"], "steps": 1, "env": {"1A": "x"}}, "multislice:workload.env: '1A' is not an environment"),
        (
            {"command": ["x"], "steps": 1, "env": {"MULTISLICE_RUN_DIR": "x"}},
            "multislice:workload.env.MULTISLICE_RUN_DIR: is set by",
        ),
        (
            {"command": ["x"], "steps": 1, "env": {"MEGASCALE_SLICE_ID": "0"}},
            "multislice:workload.env.MEGASCALE_SLICE_ID: is set by",
        ),
        *(
            (
                {"command": ["x"], "steps": 1, "env": {name: "10.0.0.2:8482"}},
                f"multislice:workload.env.{name}: is set by the workload contract (docs/workloads.md) and cannot be "
                "overridden: it tells JAX where the run's coordinator is",
            )
            for name in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS", "TPU_WORKER_HOSTNAMES")
        ),
        # an env value is never shown (under a name such as DB_PASSWORD it is a secret): its type is
        ({"command": ["x"], "steps": 1, "env": {"A": True}}, "multislice:workload.env: A: a bool is not a string"),
        ({"command": ["x"], "steps": 1, "extra": 1}, "multislice:workload.extra:"),
    ],
)
def test_each_bad_input_is_one_line_naming_its_key(tmp_path, workload, expected):
    lines = error_lines(tmp_path, workload)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_a_source_that_is_a_file_or_too_large_or_holds_a_link(tmp_path, monkeypatch):
    (tmp_path / "file.py").write_text("x")
    assert (
        "is not a directory"
        in error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": str(tmp_path / "file.py")})[0]
    )
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(b"x" * 100)
    monkeypatch.setattr(workload_config, "MAX_SOURCE_BYTES", 50)
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": str(src)})
    assert line.startswith("multislice:workload.source: ") and "ship the code only" in line
    monkeypatch.undo()
    (src / "link").symlink_to(tmp_path / "file.py")
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": str(src)})
    assert "link under" in line and "is a symbolic link" in line


def test_skipped_directories_do_not_ship(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"x")
    (tmp_path / "pkg" / "a.py").write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in workload_config.source_files(tmp_path)] == ["pkg/a.py"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("numpy>=2.0 --hash=sha256:" + HASH, "line 1: 'numpy>=2.0' is not pinned as name==version"),
        ("numpy==2.0.0\n", "line 1: numpy==2.0.0 has no --hash=sha256"),
        ("-e .\n", "line 1: '-e': only pinned requirements"),
        ("--index-url https://x\n", "line 1: '--index-url': only pinned requirements"),
        (f"numpy==2.0.0 --hash=md5:{HASH[:32]}\n", "line 1: '--hash=md5:"),
        ("# nothing\n", "holds no requirement"),
    ],
)
def test_requirements_must_be_pinned_with_hashes(tmp_path, text, expected):
    (tmp_path / "req.txt").write_text(text)
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "requirements": str(tmp_path / "req.txt")})
    assert line.startswith("multislice:workload.requirements: ") and expected in line, line


def test_requirements_as_uv_writes_them_parse():
    text = (
        "# This file was autogenerated by uv via the following command:\n"
        "#    uv pip compile req.in --generate-hashes\n"
        f"absl-py==2.1.0 \\\n    --hash=sha256:{HASH} \\\n    --hash=sha256:{'b' * 64}\n"
        "    # via -r req.in\n"
        f"numpy[extra]==2.0.0 ; python_version >= '3.11' \\\n    --hash=sha256:{HASH}\n"
    )
    assert workload_config.parse_requirements(text) == [
        PinnedRequirement("absl-py", "2.1.0", None, None, (HASH, "b" * 64)),
        PinnedRequirement("numpy", "2.0.0", None, "python_version >= '3.11'", (HASH,)),
    ]


#: A GitHub archive of one commit, as MaxText's requirements name them (docs/workloads.md).
ARCHIVE = "https://github.com/AI-Hypercomputer/JetStream/archive/29329e8e73820993f77cfc8efe34eb2a73f5de98.zip"


def test_a_hash_pinned_url_requirement_is_accepted(tmp_path):
    # As `uv pip compile --generate-hashes` writes a direct reference: the URL, then its hash.
    text = (
        f"absl-py==2.1.0 \\\n    --hash=sha256:{HASH}\n"
        f"google-jetstream @ {ARCHIVE} \\\n    --hash=sha256:{'b' * 64}\n    # via -r requirements.in\n"
        f"mlperf-logging[x] @ https://example.com/logging.tar.gz ; sys_platform == 'linux' --hash=sha256:{HASH}\n"
    )
    assert workload_config.parse_requirements(text) == [
        PinnedRequirement("absl-py", "2.1.0", None, None, (HASH,)),
        PinnedRequirement("google-jetstream", None, ARCHIVE, None, ("b" * 64,)),
        PinnedRequirement(
            "mlperf-logging", None, "https://example.com/logging.tar.gz", "sys_platform == 'linux'", (HASH,)
        ),
    ]
    (tmp_path / "req.txt").write_text(text)
    config = load_stack_file(stack_file(tmp_path, {"command": ["x"], "steps": 1, "requirements": "../req.txt"}))
    assert config.workload is not None and config.workload.requirements == tmp_path / "req.txt"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # A VCS checkout has no archive to hash: the message names the commit's archive URL.
        (
            "google-jetstream @ git+https://github.com/AI-Hypercomputer/JetStream.git@"
            f"29329e8e73820993f77cfc8efe34eb2a73f5de98 --hash=sha256:{HASH}",
            f"line 2: 'google-jetstream @ git+https://github.com/AI-Hypercomputer/JetStream.git@29329e8e7382099"
            f"3f77cfc8efe34eb2a73f5de98' is a git checkout, which cannot be hash-checked (uv pip install "
            f"--require-hashes on the VM refuses it); install {ARCHIVE} instead, as `google-jetstream @ <that URL> "
            "--hash=sha256:<its sha256>` (its sha256 is `curl -fsSL URL | sha256sum`",
        ),
        ("git+https://github.com/o/r@main", "https://github.com/o/r/archive/<40-hex commit>.zip instead"),
        (f"x @ http://example.com/x.zip --hash=sha256:{HASH}", "'x @ http://example.com/x.zip' is plain http;"),
        (
            f"google-jetstream @ {ARCHIVE}",
            f"line 2: 'google-jetstream @ {ARCHIVE}' has no --hash=sha256:… option; a URL requirement needs the "
            f"sha256 of the archive, as every requirement does (uv pip install --require-hashes on the VM): its "
            f"sha256 is `curl -fsSL {ARCHIVE} | sha256sum`",
        ),
        (f"./vendor/pkg --hash=sha256:{HASH}", "line 2: './vendor/pkg' is a local path: the VMs do not have"),
        (f"pkg @ file:///home/me/pkg.whl --hash=sha256:{HASH}", "'pkg @ file:///home/me/pkg.whl' is a local path"),
        (f"dist/pkg-1.0.tar.gz --hash=sha256:{HASH}", "'dist/pkg-1.0.tar.gz' is a local path"),
        (f"pkg @ ftp://example.com/p.zip --hash=sha256:{HASH}", "only https URLs are installed"),
        (f"https://example.com/p.zip --hash=sha256:{HASH}", "'https://example.com/p.zip' has no name"),
        (
            f"pkg @ https://github.com/o/r/archive/refs/heads/main.zip --hash=sha256:{HASH}",
            "is the archive of a branch, which changes with every push",
        ),
        (f"numpy==2.0.* --hash=sha256:{HASH}", "'numpy==2.0.*' is not pinned as name==version or name @ https://"),
        (f"numpy==2.0 ; python_version >> '3' --hash=sha256:{HASH}", "its marker does not parse"),
    ],
    ids=[
        "git",
        "git-without-name",
        "http",
        "url-without-hash",
        "path",
        "file-url",
        "archive-path",
        "ftp",
        "url-without-name",
        "branch-archive",
        "wildcard",
        "bad-marker",
    ],
)
def test_unpinnable_requirements_are_refused_with_what_to_do(tmp_path, line, expected):
    (tmp_path / "req.txt").write_text(f"absl-py==2.1.0 --hash=sha256:{HASH}\n{line}\n")
    (message,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "requirements": str(tmp_path / "req.txt")})
    assert message.startswith(f"multislice:workload.requirements: {tmp_path / 'req.txt'}: "), message
    assert expected in message, message


def test_training_and_workload_together_are_refused(tmp_path):
    lines = error_lines(tmp_path, {"command": ["x"], "steps": 1}, **{"multislice:training": {"steps": 5}})
    assert lines == [
        "multislice:training: configures the bundled trainer, and multislice:workload runs a command instead: keep "
        "one of them"
    ]


def test_a_source_that_is_a_symbolic_link_loop_says_so(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for source, shown in [("../loop", tmp_path / "loop"), ("../loop/src", tmp_path / "loop" / "src")]:
        (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": source})
        assert line == (
            f"multislice:workload.source: {shown} is a symbolic link loop (it, or a folder on its way, is a link that "
            "leads back to itself), so it leads to no directory: write the path of the real directory (a source "
            "directory ships regular files only: links in it are refused)"
        ), line
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "requirements": "../loop"})
    assert line.startswith(f"multislice:workload.requirements: {tmp_path / 'loop'} is a symbolic link loop"), line
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": "../dangling"})
    dangling, nowhere = tmp_path / "dangling", tmp_path / "nowhere"
    assert line == f"multislice:workload.source: {dangling} is a symbolic link to {nowhere}, which does not exist"


def test_a_link_loop_inside_the_source_is_named_as_a_link(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("x = 1\n")
    (tmp_path / "src" / "loop").symlink_to(tmp_path / "src" / "loop")
    (line,) = error_lines(tmp_path, {"command": ["x"], "steps": 1, "source": "../src"})
    assert line.startswith(f"multislice:workload.source: loop under {tmp_path / 'src'} is a symbolic link;"), line


def test_cli_plan_refuses_a_source_link_loop_with_exit_2(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = stack_file(tmp_path, {"command": ["x"], "steps": 1, "source": "../loop"})
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    lines = result.output.splitlines()
    assert lines[0] == f"error: stack 'wl' ({path}) is invalid:" and len(lines) == 2, lines
    assert lines[1].startswith(f"  multislice:workload.source: {tmp_path / 'loop'} is a symbolic link loop"), lines
    assert "does not exist" not in result.output
