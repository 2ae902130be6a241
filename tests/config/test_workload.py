"""multislice:workload (infra/config/workload.py): a stack's own command; each bad input is one
line naming its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config import StackConfigError, load_stack_file, validate_stack, workload as workload_config

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
            "multislice:workload.env: MULTISLICE_RUN_DIR is set by",
        ),
        (
            {"command": ["x"], "steps": 1, "env": {"MEGASCALE_SLICE_ID": "0"}},
            "multislice:workload.env: MEGASCALE_SLICE_ID is set by",
        ),
        *(
            (
                {"command": ["x"], "steps": 1, "env": {name: "10.0.0.2:8482"}},
                f"multislice:workload.env: {name} is set by the workload contract (docs/workloads.md) and cannot be "
                "overridden: it tells JAX where the run's coordinator is",
            )
            for name in ("JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS", "TPU_WORKER_HOSTNAMES")
        ),
        ({"command": ["x"], "steps": 1, "env": {"A": True}}, "multislice:workload.env: A: True is not a string"),
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
        ("absl-py", "2.1.0", None, [HASH, "b" * 64]),
        ("numpy", "2.0.0", "python_version >= '3.11'", [HASH]),
    ]


def test_training_and_workload_together_are_refused(tmp_path):
    lines = error_lines(tmp_path, {"command": ["x"], "steps": 1}, **{"multislice:training": {"steps": 5}})
    assert lines == [
        "multislice:training: configures the bundled trainer, and multislice:workload runs a command instead: keep "
        "one of them"
    ]
