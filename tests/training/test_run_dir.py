"""training.run_dir: one run directory interface, local path or gs:// (the emulated Cloud
Storage of tests/conftest.py), with whole-object atomic writes and fresh listings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from training.run_dir import RunDir, RunDirError


@pytest.fixture(params=["local", "gs"])
def run_dir(request, tmp_path) -> RunDir:
    if request.param == "local":
        return RunDir(str(tmp_path / "run"))
    return RunDir(f"gs://{request.getfixturevalue('bucket')}/runs/demo")


def test_written_files_read_back_and_absent_ones_are_none(run_dir):
    assert run_dir.read("COMPLETE") is None
    run_dir.write("COMPLETE", b'{"step": 3}')
    run_dir.write("metrics/00000000.jsonl", b"a\n")
    assert run_dir.read("COMPLETE") == b'{"step": 3}'
    run_dir.write("COMPLETE", b'{"step": 4}')  # replaced whole
    assert run_dir.read("COMPLETE") == b'{"step": 4}'
    assert run_dir.list("*") == ["COMPLETE", "metrics"]  # no temporary file is left
    assert run_dir.list("metrics/*.jsonl") == ["metrics/00000000.jsonl"]


def test_listings_see_what_another_process_wrote(run_dir):
    run_dir.write("metrics/00000000.jsonl", b"a\n")
    assert run_dir.list("metrics/*.jsonl") == ["metrics/00000000.jsonl"]
    writer = f"from training.run_dir import RunDir; RunDir({str(run_dir)!r}).write('metrics/00000001.jsonl', b'b\\n')"
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    assert run_dir.list("metrics/*.jsonl") == ["metrics/00000000.jsonl", "metrics/00000001.jsonl"]
    assert run_dir.read("metrics/00000001.jsonl") == b"b\n"


def test_unusable_run_directories(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        RunDir(str(tmp_path / "file"))
    with pytest.raises(RunDirError, match="is empty"):
        RunDir("  ")
    assert str(RunDir("gs://b/runs/x/")) == "gs://b/runs/x"
