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
        # Anywhere in a message, any scheme; a URI a path swallowed the // of; the other shapes.
        (
            "line 1: 'pkg @ git+https://ci:hunter22@github.com/a/b' is a checkout",
            "line 1: 'pkg @ git+https://ci:***@github.com/a/b' is a checkout",
        ),
        ("postgres://app:hunter22@db:5432/x", "postgres://app:***@db:5432/x"),
        ("/stacks/https:/u:hunter22@host/x does not exist", "/stacks/https:***@host/x does not exist"),
        ("ya29." + "b" * 30, "ya29***"),
        ("xoxe-1-" + "C" * 20, "xoxe***"),
        ("https://hooks.slack.com/services/T01/B02/" + "s" * 24, "https://hooks.slack.com/services/T01/B02/***"),
        (
            "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADAN\\n-----END PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----",
        ),
        ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + "A" * 40, "MIIE***"),
        ("AKIA" + "Q" * 16 + " " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz3kq9v2Lp", "AKIA*** ***"),
        ("multislice:gke.image: '***@ghcr.io/o/i:1' is not", "multislice:gke.image: '***@ghcr.io/o/i:1' is not"),
        # Nothing secret: unchanged (a digest's @ comes after the path; a plain path; an email-like tag).
        ("python:3.12@sha256:" + "0" * 64, "python:3.12@sha256:" + "0" * 64),
        ("MIIDXTCCAkWgAwIBAgIJ" + "A" * 60, "MIIDXTCCAkWgAwIBAgIJ" + "A" * 60),  # a certificate
        ("gcr.io/p/i@sha256:" + "0" * 64, "gcr.io/p/i@sha256:" + "0" * 64),
        ("python:3.12-bookworm", "python:3.12-bookworm"),
        ("/data/train/*.txt", "/data/train/*.txt"),
    ],
)
def test_secrets_are_hidden_and_the_rest_is_kept(value, shown):
    assert redacted(value) == shown
