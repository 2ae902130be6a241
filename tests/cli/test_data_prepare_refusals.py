"""``multislice data prepare`` and ``python -m training data prepare`` refuse, in one ``error:``
line with exit 2 and before anything is written, a source, output or tokenizer URI of a scheme
they do not read (``https://``, with its password never echoed) and an output that cannot be a
directory (an existing file, a path under a file, ``/dev/null/x``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from infra.cli import app
from training.prepare.arguments import redacted


def prepare(tmp_path, *args: str):
    env = {"MULTISLICE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"}
    return CliRunner().invoke(app, ["data", "prepare", *args], env=env, color=False)


def refusal(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("https://user:s3cret@host/path/*.txt", "https://user:***@host/path/*.txt"),
        ("https://token-s3cret@host/path", "https://***@host/path"),
        ("https://user:s3cret@host", "https://user:***@host"),
        ("https://host/path/*.txt", "https://host/path/*.txt"),
        ("/data/a@b/*.txt", "/data/a@b/*.txt"),
    ],
)
def test_a_uri_is_shown_without_its_password(uri, shown):
    assert redacted(uri) == shown


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["https://user:s3cret@host/path/*.txt", "{out}"], "SOURCE 'https://user:***@host/path/*.txt': https://"),
        (["https://host/path/*.txt", "{out}"], "SOURCE 'https://host/path/*.txt': https:// is not supported"),
        (["stdlib", "https://user:s3cret@host/ds"], "OUTPUT 'https://user:***@host/ds': https://"),
        (["gs://user:s3cret@bucket/text/*.txt", "{out}"], "SOURCE 'gs://user:***@bucket/text/*.txt': a gs:// URI"),
        (["stdlib", "{out}", "--tokenizer", "https://s3cret@host/t.json"], "--tokenizer 'https://***@host/t.json'"),
    ],
)
def test_a_uri_the_command_does_not_read_is_one_line_without_the_password(tmp_path, args, named):
    out = tmp_path / "ds"
    line = refusal(prepare(tmp_path, *[a.format(out=out) for a in args]))
    assert named in line, line
    assert "s3cret" not in line
    assert not out.exists()


def outputs(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("text\n")
    return {
        "an existing file": (str(a_file), f"OUTPUT {a_file}: is not a directory"),
        "under a file": (str(a_file / "ds"), f"OUTPUT {a_file / 'ds'}: {a_file} is not a directory"),
        "/dev/null": ("/dev/null", "OUTPUT /dev/null: is not a directory"),
        "under /dev/null": ("/dev/null/ds", "OUTPUT /dev/null/ds: /dev/null is not a directory"),
    }


@pytest.mark.parametrize("which", ["an existing file", "under a file", "/dev/null", "under /dev/null"])
def test_an_output_that_cannot_be_a_directory_is_bad_input(tmp_path, which):
    output, named = outputs(tmp_path)[which]
    line = refusal(prepare(tmp_path, "stdlib", output))
    assert line.startswith(f"error: {named}"), line
    assert (tmp_path / "a-file").read_text() == "text\n"


def test_the_trainers_own_command_refuses_the_same_way(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "training", "data", "prepare", "https://user:s3cret@host/x/*.txt", str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: SOURCE 'https://user:***@host/x/*.txt': https:// is not supported; SOURCE is a local path or "
        "glob, a gs:// URI or 'stdlib'"
    )
