"""The files of a text source (``DataConfig.source``: ``"stdlib"``, a local glob or a ``gs://``
glob), and their split into train and eval by a hash of each file's relative path (stable when
files are added or removed). The byte reader (:mod:`training.data.text`) and ``data prepare``
(:mod:`training.prepare`) list and split files alike through this module."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from pathlib import Path

from etils import epath

from training.data.base import DataError


@dataclasses.dataclass(frozen=True)
class SourceFile:
    path: str  # local path or gs:// URI
    relative: str  # stable name used for the train/eval split
    size: int  # bytes, separator excluded


def list_source_files(source: str) -> list[SourceFile]:
    """Files of a data source, sorted by relative path.

    Raises:
      DataError: the glob matches no non-empty file.
    """
    files: list[SourceFile] = []
    if source == "stdlib":
        files = _stdlib_files(Path(sysconfig.get_paths()["stdlib"]))
    elif "://" in source:  # epath's glob (no "**": each level is one listing request)
        bucket_path, glob = _split_glob(source)
        for path in sorted(epath.Path(bucket_path).glob(glob), key=str):
            stat = path.stat()
            if stat.length:
                files.append(SourceFile(str(path), str(path)[len(bucket_path) :].lstrip("/"), stat.length))
    else:
        base, glob = _split_glob(source)
        root = Path(base)
        for path in sorted(root.glob(glob)) if glob else [root]:
            if path.is_file() and path.stat().st_size:
                files.append(
                    SourceFile(str(path), path.relative_to(root).as_posix() if glob else path.name, path.stat().st_size)
                )
    if not files:
        raise DataError(f"training.data.source {source!r} matches no non-empty file")
    return sorted(files, key=lambda f: f.relative)


def _stdlib_files(root: Path) -> list[SourceFile]:
    """The ``*.py`` files under the standard library's directory ``root`` (symlinked
    directories not followed, as ``Path.rglob`` does), none under a ``site-packages`` or
    ``__pycache__`` directory. One ``os.walk`` that never enters those directories: every
    start of the trainer builds this list, and ``rglob`` plus a filter walked the installed
    packages too (measured: docs/goodput.md, "Start-up")."""
    files: list[SourceFile] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if "site-packages" not in d and "__pycache__" not in d]
        prefix = os.path.relpath(directory, root).replace(os.sep, "/")
        for name in names:
            if not name.endswith(".py") or "site-packages" in name or "__pycache__" in name:
                continue
            path = os.path.join(directory, name)
            size = os.stat(path).st_size
            if size:
                files.append(SourceFile(path, name if prefix == "." else f"{prefix}/{name}", size))
    return files


def _split_glob(source: str) -> tuple[str, str]:
    """Split ``dir/sub/*.txt`` into the longest wildcard-free directory and the pattern."""
    parts = source.split("/")
    for index, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:index]) or "/", "/".join(parts[index:])
    return source, ""


def is_eval_file(relative: str, eval_fraction: float) -> bool:
    """Deterministic split: the first 8 bytes of sha256(relative path) as a fraction."""
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction
