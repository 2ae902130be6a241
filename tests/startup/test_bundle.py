"""infra/startup/bundle.py: reproducible uncompressed archives (the trainer bundle, the release), and
xz compression whose bytes nothing depends on."""

from __future__ import annotations

import ast
import io
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from infra.startup.bundle import (
    BUNDLE_PACKAGE,
    MACHINE_ONLY_PACKAGES,
    build_archive,
    build_bundle,
    bundle_files,
    compress,
    trainer_files,
)
from infra.startup.shipped_source import strip_documentation

ROOT = Path(__file__).resolve().parents[2]


def test_bundle_deterministic_and_extractable(tmp_path):
    training = tmp_path / "p" / "training"
    shutil.copytree(ROOT / "training", training, ignore=shutil.ignore_patterns("__pycache__"))
    bundle = build_bundle(training)
    # Noise that must not enter the bundle: caches, non-Python files, file times.
    (training / "__pycache__").mkdir(exist_ok=True)
    (training / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (training / "__pycache__" / "stray.py").write_text("x = 1\n")
    (training / "notes.txt").write_text("not shipped\n")
    for path in training.rglob("*.py"):
        os.utime(path, (1, 1))
    assert build_bundle(training) == bundle == build_bundle(ROOT / "training")

    assert bundle[257:263] == b"ustar\0"  # POSIX ustar, uncompressed
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        expected = sorted(
            f"training/{p.relative_to(ROOT / 'training').as_posix()}"
            for p in (ROOT / "training").rglob("*.py")
            if p.relative_to(ROOT / "training").parts[0] not in MACHINE_ONLY_PACKAGES
        )
        assert names == expected
        for member in members:
            assert member.isreg() and member.mode == 0o644 and member.mtime == 0
            assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
            assert not member.pax_headers
            data = tar.extractfile(member).read()
            assert data == strip_documentation((ROOT / member.name).read_bytes())  # as it ships
        tar.extractall(tmp_path / "out", filter="data")
    extracted = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert extracted == expected


def test_subpackages_are_bundled_in_path_order(tmp_path):
    training = tmp_path / "training"
    for relative in ("b.py", "sub/a.py", "a.py", "sub/__pycache__/c.py", "z.txt"):
        (training / relative).parent.mkdir(parents=True, exist_ok=True)
        (training / relative).write_text(f"# {relative}\n")
    assert [p.relative_to(training).as_posix() for p in bundle_files(training)] == ["a.py", "b.py", "sub/a.py"]
    assert list(trainer_files(training)) == [
        f"{BUNDLE_PACKAGE}/a.py",
        f"{BUNDLE_PACKAGE}/b.py",
        f"{BUNDLE_PACKAGE}/sub/a.py",
    ]
    with tarfile.open(fileobj=io.BytesIO(build_bundle(training)), mode="r:") as tar:
        assert tar.getnames() == [f"{BUNDLE_PACKAGE}/a.py", f"{BUNDLE_PACKAGE}/b.py", f"{BUNDLE_PACKAGE}/sub/a.py"]


def test_archive_sorts_entries_and_refuses_paths_outside(tmp_path):
    files = {"z.txt": b"z\n", "boot.sh": b"#!/bin/bash\n", "training/a.py": b"a = 1\n"}
    archive = build_archive(files)
    assert archive == build_archive(dict(reversed(list(files.items()))))
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        assert tar.getnames() == ["boot.sh", "training/a.py", "z.txt"]
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == files
    for bad in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError, match="relative"):
            build_archive({bad: b""})


def test_empty_training_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to bundle"):
        build_bundle(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing to bundle"):
        build_bundle(tmp_path / "missing")


def test_compress_is_xz_that_the_xz_tool_reads(tmp_path):
    data = build_bundle(ROOT / "training")
    packed = compress(data)
    assert packed[:6] == b"\xfd7zXZ\0" and len(packed) < len(data) / 3
    assert lzma.decompress(packed) == data
    if shutil.which("xz"):
        assert subprocess.run(["xz", "-dc"], input=packed, capture_output=True, check=True).stdout == data
    # Another level gives other bytes for the same content: nothing may compare them.
    other = compress(data, preset=1)
    assert other != packed and lzma.decompress(other) == data


def test_no_shipped_module_needs_a_machine_only_one():
    """The VMs' bundle leaves ``data prepare`` out: no module it ships imports one of those, except
    ``__main__``'s ``data prepare`` command, which says where to run it instead."""
    machine_only = set(MACHINE_ONLY_PACKAGES)
    offenders = []
    for path in bundle_files(ROOT / "training"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module.removeprefix("training.").split(".")[0]} | {
                    alias.name for alias in node.names if node.module == "training"
                }
            elif isinstance(node, ast.Import):
                names = {alias.name.removeprefix("training.").split(".")[0] for alias in node.names}
            else:
                continue
            if names & machine_only:
                offenders.append((path.name, sorted(names & machine_only)))
    assert offenders == [("__main__.py", ["prepare"])]
