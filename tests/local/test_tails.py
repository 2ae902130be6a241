"""infra.local.tails: following the trainer's record logs (one object per sync window,
training.metrics.run_log) while they are written, locally and through the emulated Cloud Storage,
and the end of a log for error messages."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infra.local.tails import MetricsTail, RecordTail, last_lines
from training.metrics.run_log import RecordLog
from training.run_dir import RunDir


@pytest.fixture(params=["local", "gs"])
def run_dir(request, tmp_path) -> RunDir:
    if request.param == "local":
        return RunDir(str(tmp_path / "run"))
    return RunDir(f"gs://{request.getfixturevalue('bucket')}/runs/demo")


def write(run_dir: RunDir, name: str, *records: dict) -> None:
    """One sync window of ``records``, as a new writer (a trainer start) writes it."""
    log = RecordLog(run_dir, name)
    for record in records:
        log.append(record)
    log.close()


def test_an_absent_log_has_no_records_until_it_appears(run_dir):
    tail = RecordTail(run_dir, "events")
    assert tail.poll() == [] and tail.poll() == []
    write(run_dir, "events", {"event": "start"})
    assert tail.poll() == [{"event": "start"}]


def test_each_record_is_returned_once(run_dir):
    tail = RecordTail(run_dir, "metrics")
    write(run_dir, "metrics", {"step": 1}, {"step": 2})
    assert tail.poll() == [{"step": 1}, {"step": 2}]
    assert tail.poll() == []
    write(run_dir, "metrics", {"step": 3})
    write(run_dir, "metrics", {"step": 4})
    assert tail.poll() == [{"step": 3}, {"step": 4}]
    assert tail.poll() == []


def test_a_discarded_and_restarted_log_is_read_from_its_start(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    tail = RecordTail(run_dir, "metrics")
    for step in (1, 2, 3):
        write(run_dir, "metrics", {"step": step})
    assert len(tail.poll()) == 3
    for path in (tmp_path / "run" / "metrics").iterdir():  # --fresh
        path.unlink()
    write(run_dir, "metrics", {"step": 7})
    assert tail.poll() == [{"step": 7}]


def test_metrics_tail_follows_training_records_only(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    tail = MetricsTail(run_dir)
    assert (tail.last_step, tail.last_loss) == (0, None)
    write(run_dir, "metrics", {"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "eval_loss": 9.0})
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (2, 2.5)  # the eval record is not a training step
    # After a restart the trainer writes earlier steps again: the newest record wins.
    write(run_dir, "metrics", {"step": 1, "loss": 3.0})
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (1, 3.0)


def test_after_a_restart_the_newest_step_is_where_the_new_attempt_resumed(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    tail = MetricsTail(run_dir)
    write(run_dir, "metrics", *({"step": s, "loss": 10.0 / s, "time": 100.0 + s} for s in range(1, 51)))
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (50, 0.2)
    tail.resumed(40, began=200.0)  # killed at 50, resumed from the checkpoint of step 40
    assert (tail.last_step, tail.last_loss) == (40, None)  # not the struck attempt's step 50 again
    # The struck attempt's last window, read only now, is not this attempt's progress.
    write(run_dir, "metrics", {"step": 51, "loss": 0.19, "time": 151.0})
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (40, None)
    write(run_dir, "metrics", {"step": 41, "loss": 0.25, "time": 205.0})
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (41, 0.25)
    tail.resumed(41, began=300.0)  # a preemption saved the step it stopped at: nothing to take back
    assert (tail.last_step, tail.last_loss) == (41, 0.25)


def test_metrics_tail_marks_when_a_step_was_last_seen(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    tail = MetricsTail(run_dir)
    tail.last_change = before = time.monotonic() - 100.0  # as if long ago
    write(run_dir, "metrics", {"step": 1, "eval_loss": 1.0})
    tail.poll()
    assert tail.last_change == before  # no training record: no progress
    write(run_dir, "metrics", {"step": 1, "loss": 1.0})
    tail.poll()
    assert tail.last_change > before


def test_last_lines(tmp_path):
    log = tmp_path / "vm.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(30)) + b"bad \xff byte")
    assert last_lines(log, 3) == ["line 28", "line 29", "bad \ufffd byte"]
    assert last_lines(log, 100)[0] == "line 0"
    assert last_lines(tmp_path / "absent.log", 3) is None


def test_last_lines_reads_only_the_end_of_a_regular_file(tmp_path, monkeypatch):
    from infra.local import tails

    monkeypatch.setattr(tails, "MAX_TAIL_BYTES", 40)
    log = tmp_path / "vm.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1000)))
    assert last_lines(log, 100) == ["line 996", "line 997", "line 998", "line 999"]  # whole lines of the last 40 bytes
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    assert last_lines(fifo, 3) is None  # refused on its descriptor, not waited on
    assert last_lines(Path("/dev/zero"), 3) is None  # never read: it would never end


@pytest.mark.parametrize(
    "bad",
    [
        {"step": "x", "loss": 1.0},
        {"step": None, "loss": 1.0},
        {"step": 2.5, "loss": 1.0},
        {"step": True, "loss": 1.0},
        {"step": 3, "loss": None},
        {"step": 3, "loss": "nan?"},
        {"loss": 1.0},
        {"step": 3, "loss": 1.0, "tokens_per_s": None},
    ],
    ids=["string-step", "null-step", "float-step", "bool-step", "null-loss", "string-loss", "no-step", "null-rate"],
)
def test_a_malformed_metrics_record_is_skipped_with_one_warning(tmp_path, bad):
    from infra.local.progress import ProgressTail

    run_dir = RunDir(str(tmp_path / "run"))
    warnings: list[str] = []
    tail = ProgressTail(run_dir, warn=warnings.append)
    write(run_dir, "metrics", {"step": 1, "loss": 2.0}, bad, {"step": 2, "loss": 1.5})
    write(run_dir, "metrics", bad)
    assert tail.poll() == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    assert (tail.last_step, tail.last_loss, tail.skipped) == (2, 1.5, 2)
    assert len(warnings) == 1 and "skipped a malformed record of the run's metrics log" in warnings[0]


def test_a_malformed_event_is_skipped_and_a_completion_with_a_null_loss_is_kept(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    warnings: list[str] = []
    tail = RecordTail(run_dir, "events", warn=warnings.append)
    write(
        run_dir,
        "events",
        {"event": "start", "step": "7"},
        {"event": "start", "step": 0, "time": None},
        {"event": "complete", "step": 4, "loss": None, "time": 1.0},
    )
    assert tail.poll() == [{"event": "complete", "step": 4, "loss": None, "time": 1.0}]
    assert (
        len(warnings) == 1
        and "step '7' is not an integer" in warnings[0]
        and "(and 1 more in that object)" in warnings[0]
    )
