"""training.run_dir: one run directory interface, local path or gs:// (the emulated Cloud
Storage of tests/conftest.py), with whole-object atomic writes and fresh listings."""

from __future__ import annotations

import os
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


def test_a_local_object_that_is_not_a_regular_file_or_too_long_is_refused_unread(tmp_path, monkeypatch):
    # training.run_objects.file_bytes: a FIFO would block the read, /dev/zero never ends. The refusal is an
    # OSError and a ValueError: each reader takes it as it takes a damaged object, in one line.
    from training import heartbeats, membership, run_objects
    from training.checkpoint import completion, manager

    run = tmp_path / "run"
    run_dir = RunDir(str(run))
    for folder in ("heartbeats", "membership"):
        (run / folder).mkdir(parents=True)
    os.mkfifo(run / "COMPLETE")
    os.symlink("/dev/zero", run / "heartbeats" / "slice-0-worker-0.json")
    os.mkfifo(run / "membership" / "00000001.json")
    os.mkfifo(run / "train_config.json")
    with pytest.raises(run_objects.UnreadableObject, match="^a FIFO, not a regular file$") as raised:
        run_dir.read("COMPLETE")
    assert isinstance(raised.value, OSError) and isinstance(raised.value, ValueError)
    assert completion.read_completion(run_dir) is None  # a damaged marker counts as absent
    assert heartbeats.read_all(run_dir) == []  # a heartbeat that is not one is left out
    with pytest.raises(membership.MembershipError, match=r"00000001.json is not one .* \(a FIFO, not a regular"):
        membership.read(run_dir, 1)
    with pytest.raises(manager.RunConfigMismatch, match=r"train_config.json is unreadable \(a FIFO, not a regular"):
        manager.check_run_config(run_dir, None)  # refused before the config is looked at
    (run / "train_config.json").unlink()
    run_dir.write("train_config.json", b"{}" + b" " * 100)
    monkeypatch.setattr(run_objects.file_bytes, "__defaults__", (64,))
    with pytest.raises(run_objects.UnreadableObject, match="^102 bytes, over the 64 read$"):
        run_dir.read("train_config.json")
