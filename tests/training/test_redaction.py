"""training.redaction: the one way a message shows a value that may carry a secret."""

from __future__ import annotations

import pytest

from training.redaction import redacted


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("https://user:hunter22@host/path", "https://user:***@host/path"),
        ("gs://tok3n@bucket/x", "gs://***@bucket/x"),
        ("user:hunter22@registry.io/org/img:1", "user:***@registry.io/org/img:1"),
        ("ghp_" + "a" * 36 + "@ghcr.io/org/img", "***@ghcr.io/org/img"),
        ("token=hf_" + "B" * 30, "token=hf_B***"),
        ("xoxb-1234567890-abcdef url", "xoxb*** url"),
        ("AKIA" + "Q" * 16, "AKIA***"),
        ("AIza" + "x" * 35, "AIza***"),
        # Nothing secret: unchanged (a digest's @ comes after the path; a plain path; an email-like tag).
        ("gcr.io/p/i@sha256:" + "0" * 64, "gcr.io/p/i@sha256:" + "0" * 64),
        ("python:3.12-bookworm", "python:3.12-bookworm"),
        ("/data/train/*.txt", "/data/train/*.txt"),
    ],
)
def test_secrets_are_hidden_and_the_rest_is_kept(value, shown):
    assert redacted(value) == shown
