"""infra.local.tails: following the trainer's JSON-lines files while they are written, and
the end of a log for error messages."""

from __future__ import annotations

import json
import os
import time

from infra.local.tails import JsonlTail, MetricsTail, last_lines


def line(record: dict) -> bytes:
    return (json.dumps(record) + "\n").encode()


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_an_absent_file_has_no_records_until_it_appears(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == [] and tail.poll() == []
    append(path, line({"event": "start"}))
    assert tail.poll() == [{"event": "start"}]


def test_each_record_is_returned_once(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    append(path, line({"step": 1}) + line({"step": 2}))
    assert tail.poll() == [{"step": 1}, {"step": 2}]
    assert tail.poll() == []
    append(path, line({"step": 3}))
    assert tail.poll() == [{"step": 3}]
    assert tail.poll() == []


def test_a_partial_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    record = line({"step": 1, "loss": 2.5})
    append(path, record[:7])  # the writer is mid-record
    assert tail.poll() == []
    append(path, record[7:-1])
    assert tail.poll() == []
    append(path, b"\n" + line({"step": 2, "loss": 2.0}))
    assert tail.poll() == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]


def test_a_torn_line_is_skipped_and_later_records_are_read(tmp_path):
    # A writer killed mid-record leaves a line without its end; the next writer ends it with
    # a newline (training.run_log) and appends whole records.
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    append(path, line({"step": 1}) + b'{"step": 2, "lo')
    assert tail.poll() == [{"step": 1}]
    append(path, b"\n" + line({"step": 2}) + b"\xff\xfe garbage\n" + b"[1, 2]\n" + line({"step": 3}))
    assert tail.poll() == [{"step": 2}, {"step": 3}]


def test_a_truncated_file_is_read_again_from_its_start(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    append(path, line({"step": 1}) + line({"step": 2}) + line({"step": 3}))
    assert len(tail.poll()) == 3
    path.write_bytes(line({"step": 7}))  # shorter than what was read
    assert tail.poll() == [{"step": 7}]


def test_a_replaced_file_is_read_from_its_start(tmp_path):
    # Replaced (a new inode, e.g. written elsewhere and renamed over) with longer content:
    # its size alone would not show it.
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    append(path, line({"step": 1}))
    assert tail.poll() == [{"step": 1}]
    new = tmp_path / "new.jsonl"
    new.write_bytes(line({"step": 10}) + line({"step": 11}) + line({"step": 12}))
    os.replace(new, path)
    assert tail.poll() == [{"step": 10}, {"step": 11}, {"step": 12}]
    assert tail.poll() == []


def test_metrics_tail_follows_training_records_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert (tail.last_step, tail.last_loss) == (0, None)
    append(path, line({"step": 1, "loss": 3.0}) + line({"step": 2, "loss": 2.5}) + line({"step": 2, "eval_loss": 9.0}))
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (2, 2.5)  # the eval record is not a training step
    # After a restart the trainer writes earlier steps again: the newest record wins.
    append(path, line({"step": 1, "loss": 3.0}))
    tail.poll()
    assert (tail.last_step, tail.last_loss) == (1, 3.0)


def test_metrics_tail_marks_when_a_step_was_last_seen(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    tail.last_change = before = time.monotonic() - 100.0  # as if long ago
    append(path, line({"step": 1, "eval_loss": 1.0}))
    tail.poll()
    assert tail.last_change == before  # no training record: no progress
    append(path, line({"step": 1, "loss": 1.0}))
    tail.poll()
    assert tail.last_change > before


def test_last_lines(tmp_path):
    log = tmp_path / "vm.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(30)) + b"bad \xff byte")
    assert last_lines(log, 3) == ["line 28", "line 29", "bad \ufffd byte"]
    assert last_lines(log, 100)[0] == "line 0"
    assert last_lines(tmp_path / "absent.log", 3) is None
