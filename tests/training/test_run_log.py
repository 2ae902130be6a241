"""training.metrics.run_log: records are written one object per sync window (never rewritten, so a
sync costs its own window whatever the run's length), read back in order, locally and on
gs:// (the emulated Cloud Storage of tests/conftest.py); TensorBoard files likewise."""

from __future__ import annotations

import json

import pytest

from tests.helpers.tensorboard_events import tensorboard_scalars
from training.metrics.run_log import RecordLog, TensorBoardLog, parse_records, read_records
from training.run_dir import RunDir


@pytest.fixture(params=["local", "gs"])
def run_dir(request, tmp_path) -> RunDir:
    if request.param == "local":
        return RunDir(str(tmp_path / "run"))
    return RunDir(f"gs://{request.getfixturevalue('bucket')}/runs/demo")


def test_each_sync_writes_one_object_and_later_starts_append_after_it(run_dir):
    log = RecordLog(run_dir, "metrics")
    log.append({"step": 1})
    log.append({"step": 2})
    log.sync()
    assert log.sync() == 0  # nothing new: no object
    log.append({"step": 3})
    log.close()
    assert run_dir.list("metrics/*") == ["metrics/00000000.jsonl", "metrics/00000001.jsonl"]
    restarted = RecordLog(run_dir, "metrics")  # a new attempt of the run
    restarted.append({"step": 3, "again": True})
    restarted.close()
    assert run_dir.list("metrics/*")[-1] == "metrics/00000002.jsonl"
    assert read_records(run_dir, "metrics") == [{"step": 1}, {"step": 2}, {"step": 3}, {"again": True, "step": 3}]


def test_the_bytes_of_a_sync_do_not_grow_with_the_run(run_dir):
    # 100 windows of 10 records: each sync sends exactly its own window's lines (a rewritten
    # growing file would send every earlier window again), so window 99 costs what window 11 did.
    log = RecordLog(run_dir, "metrics")
    sizes, expected = [], []
    for window in range(100):
        records = [{"step": step, "loss": 1.5} for step in range(window * 10 + 1, window * 10 + 11)]
        for record in records:
            log.append(record)
        sizes.append(log.sync())
        expected.append(sum(len(json.dumps(r, sort_keys=True)) + 1 for r in records))
    assert sizes == expected
    assert sizes[98] == sizes[10]  # steps 101..990: records of one size
    last = parse_records(run_dir.read(run_dir.list("metrics/*")[-1]))
    assert [r["step"] for r in last] == list(range(991, 1001))
    assert [r["step"] for r in read_records(run_dir, "metrics")] == list(range(1, 1001))


def test_only_the_writer_writes(run_dir):
    log = RecordLog(run_dir, "events", enabled=False)
    log.append({"event": "start"})
    assert log.close() == 0
    assert run_dir.list("*") == [] and read_records(run_dir, "events") == []


def test_lines_that_are_not_records_are_skipped():
    assert parse_records(b'{"step": 1}\n{"step": 2, "lo\n\xff\xfe\n[1, 2]\n\n{"step": 3}\n') == [
        {"step": 1},
        {"step": 3},
    ]


def test_tensorboard_uploads_each_window_once(run_dir):
    board = TensorBoardLog(run_dir, start_step=0)
    for step in (1, 2):
        board.scalars(step, {"train/loss": 1.0 / step})
    board.sync()
    first = run_dir.list("tensorboard/*")
    assert len(first) == 1
    board.sync()  # nothing new: no file
    board.scalars(3, {"train/loss": 0.25})
    board.close()
    files = run_dir.list("tensorboard/*")
    assert len(files) == 2 and files[0] == first[0]
    assert tensorboard_scalars(run_dir, "train/loss") == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert [step for step, _ in tensorboard_scalars(RunDir(str(run_dir)), "train/loss")] == [1, 2, 3]


def test_two_starts_in_one_second_keep_both_files(run_dir, monkeypatch):
    # tensorboardX names a file by the whole second it opened in; a crash and an in-process
    # restart open their first files within one second (seen in CI: the restart's file
    # replaced the first start's, and steps 1-4 were gone).
    import time

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.25)
    first = TensorBoardLog(run_dir, start_step=0)
    first.scalars(1, {"train/loss": 1.0})
    first.close()
    restart = TensorBoardLog(run_dir, start_step=1)
    restart.scalars(2, {"train/loss": 0.5})
    restart.close()
    assert len(run_dir.list("tensorboard/*")) == 2
    assert tensorboard_scalars(run_dir, "train/loss") == [(1, 1.0), (2, 0.5)]


def test_the_tensorboard_spool_lives_only_while_a_window_is_unsent(run_dir, spools, monkeypatch):
    # A trainer killed between syncs (a preemption without notice) cannot remove its spool: it
    # must not hold one for the whole run. A failed upload keeps its file for the next window.
    board = TensorBoardLog(run_dir, start_step=0)
    assert list(spools.iterdir()) == []
    board.scalars(1, {"train/loss": 1.0})
    assert len(list(spools.iterdir())) == 1

    def storage_down(*args) -> None:
        raise OSError("storage down")

    write = run_dir.write
    monkeypatch.setattr(run_dir, "write", storage_down)
    with pytest.raises(OSError, match="storage down"):
        board.sync()
    monkeypatch.setattr(run_dir, "write", write)
    board.scalars(2, {"train/loss": 0.5})
    board.sync()
    assert list(spools.iterdir()) == []
    assert len(run_dir.list("tensorboard/*")) == 2
    assert tensorboard_scalars(run_dir, "train/loss") == [(1, 1.0), (2, 0.5)]
    board.close()
    assert list(spools.iterdir()) == []


def test_a_discarded_window_is_not_sent_and_leaves_no_spool(run_dir, spools):
    board = TensorBoardLog(run_dir, start_step=0)
    board.scalars(1, {"train/loss": 1.0})
    board.sync()
    board.scalars(2, {"train/loss": 0.5})
    board.discard()  # a start that ended in an error
    assert list(spools.iterdir()) == []
    assert tensorboard_scalars(run_dir, "train/loss") == [(1, 1.0)]
    board.discard()  # nothing left: nothing to do
