"""training.run_objects: a run directory object's bytes decoded, and refused as ValueError, the one
exception its callers (membership, heartbeats, the completion marker, the recorded config) catch."""

from __future__ import annotations

import pytest

from training.run_objects import json_record


def test_a_record_is_its_utf8_json():
    assert json_record(b'{"step": 3, "loss": 2.5, "host": "t\\u00e9"}') == {"step": 3, "loss": 2.5, "host": "té"}


@pytest.mark.parametrize("data", [b"\xff\xfe{}", b"{", b"", b"[1, 2", "{}".encode("utf-16"), b"9" * 5000])
def test_bytes_that_are_not_utf8_json_are_a_value_error(data):
    with pytest.raises(ValueError):
        json_record(data)
