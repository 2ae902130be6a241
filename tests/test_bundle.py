"""infra/bundle.py: the trainer bundle is a reproducible tar.gz of training/*.py and nothing
else."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from infra.bundle import BUNDLE_PACKAGE, build_bundle, bundle_files

ROOT = Path(__file__).resolve().parents[1]


def test_bundle_deterministic_and_extractable(tmp_path):
    training = tmp_path / "p" / "training"
    shutil.copytree(ROOT / "training", training, ignore=shutil.ignore_patterns("__pycache__"))
    bundle = build_bundle(training)
    # Noise that must not enter the bundle: caches, non-Python files, file times.
    (training / "__pycache__").mkdir(exist_ok=True)
    (training / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (training / "__pycache__" / "stray.py").write_text("x = 1\n")
    (training / "notes.txt").write_text("not shipped\n")
    for path in training.glob("*.py"):
        os.utime(path, (1, 1))
    assert build_bundle(training) == bundle == build_bundle(ROOT / "training")

    assert bundle[:2] == b"\x1f\x8b" and bundle[4:8] == b"\0\0\0\0"  # gzip mtime 0
    assert not bundle[3] & 0x08  # no FNAME field
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        expected = sorted(f"training/{p.name}" for p in (ROOT / "training").glob("*.py"))
        assert names == expected
        for member in members:
            assert member.isreg() and member.mode == 0o644 and member.mtime == 0
            assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
            data = tar.extractfile(member).read()
            assert data == (ROOT / member.name).read_bytes()
        tar.extractall(tmp_path / "out", filter="data")
    extracted = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert extracted == expected


def test_subpackages_are_bundled_in_path_order(tmp_path):
    training = tmp_path / "training"
    for relative in ("b.py", "sub/a.py", "a.py", "sub/__pycache__/c.py", "z.txt"):
        (training / relative).parent.mkdir(parents=True, exist_ok=True)
        (training / relative).write_text(f"# {relative}\n")
    assert [p.relative_to(training).as_posix() for p in bundle_files(training)] == ["a.py", "b.py", "sub/a.py"]
    with tarfile.open(fileobj=io.BytesIO(build_bundle(training)), mode="r:gz") as tar:
        assert tar.getnames() == [f"{BUNDLE_PACKAGE}/a.py", f"{BUNDLE_PACKAGE}/b.py", f"{BUNDLE_PACKAGE}/sub/a.py"]


def test_empty_training_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to bundle"):
        build_bundle(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing to bundle"):
        build_bundle(tmp_path / "missing")
