"""training.run_log: append-only records survive torn writes."""

from __future__ import annotations

from training.run_log import JsonlLog, read_jsonl


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # killed mid-write
    log = JsonlLog(str(path))
    log.append({"step": 2, "loss": 1.5})
    log.close()
    assert read_jsonl(str(path)) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]


def test_only_the_writer_writes(tmp_path):
    path = tmp_path / "events.jsonl"
    JsonlLog(str(path), enabled=False).append({"event": "start"})
    assert not path.exists()
    log = JsonlLog(str(path))
    log.append({"event": "start", "step": 0})
    log.close()
    assert read_jsonl(str(path)) == [{"event": "start", "step": 0}]
