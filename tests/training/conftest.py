"""Fixtures the trainer's tests share."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def spools(tmp_path, monkeypatch) -> Path:
    """The temporary directory this process's TensorBoard spools are made in, empty."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory
