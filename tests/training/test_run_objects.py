"""training.run_objects: a run directory object's bytes decoded, and refused as ValueError, the one
exception its callers (membership, heartbeats, the completion marker, the recorded config) catch."""

from __future__ import annotations

import pytest

from training.run_objects import json_record


def test_a_record_is_its_utf8_json():
    assert json_record(b'{"step": 3, "loss": 2.5, "host": "t\\u00e9"}') == {"step": 3, "loss": 2.5, "host": "té"}


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe{}",
        b"{",
        b"",
        b"[1, 2",
        "{}".encode("utf-16"),
        b"9" * 5000,
        b"[" * 200_000,  # deeper than the parser takes: a RecursionError no caller catches, were it raised
        b'{"step": 1, "pad": "' + b"x" * (64 << 20) + b'"}',  # over the bound: refused before decoding
    ],
    ids=["not-utf8", "open", "empty", "cut", "utf16", "long-int", "deep", "huge"],
)
def test_bytes_that_are_not_utf8_json_are_a_value_error(data):
    with pytest.raises(ValueError):
        json_record(data)


def test_every_run_log_line_goes_through_it():
    # A line nested past the parser's depth, or with an integer past Python's limit, is skipped like any
    # other line that is not a record (training.metrics.run_log.parse_records), not raised.
    from training.metrics.run_log import parse_records

    data = b'{"step": 1}\n' + b"[" * 200_000 + b"\n" + b'{"n": ' + b"9" * 5000 + b"}\n" + b'{"step": 2}\n'
    assert parse_records(data) == [{"step": 1}, {"step": 2}]
