"""The trainer bundle: ``training/*.py`` as a reproducible ``tar.gz``.

The startup script (:mod:`infra.startup`) carries this archive, base64 in a quoted heredoc,
onto every TPU VM and checks its sha256 there before unpacking it. Equal sources give equal
bytes (no timestamps, owners or local paths), so the script changes only when the trainer
code does.
"""

from __future__ import annotations

import gzip
import io
import sys
import tarfile
import zlib
from pathlib import Path

from infra.content_cache import ContentCache, key_of

#: Name of the trainer package inside the bundle (``python -m training``).
BUNDLE_PACKAGE = "training"


def bundle_files(training_dir: Path) -> list[Path]:
    """The files that go into the bundle: ``*.py`` under ``training_dir`` (recursively, no
    ``__pycache__``), sorted by their POSIX path relative to it."""
    training_dir = Path(training_dir)
    files = [
        p
        for p in training_dir.rglob("*.py")
        if p.is_file() and "__pycache__" not in p.relative_to(training_dir).parts
    ]
    return sorted(files, key=lambda p: p.relative_to(training_dir).as_posix())


def build_bundle(training_dir: Path) -> bytes:
    """A reproducible ``tar.gz`` of the trainer package.

    Entries are ``training/<relative path>`` for :func:`bundle_files`, sorted, regular files
    only, with mtime 0, uid/gid 0, empty user/group names and mode 0644 (PAX format); the
    gzip header has mtime 0 and no file name. Equal sources give equal bytes on a machine;
    across machines the bytes also depend on the deflate implementation (zlib; a zlib-ng
    build of Python would compress differently).

    Raises:
      FileNotFoundError: ``training_dir`` is missing or holds no ``*.py`` file.
    """
    training_dir = Path(training_dir)
    files = bundle_files(training_dir) if training_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no *.py files under {training_dir}: nothing to bundle")
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{BUNDLE_PACKAGE}/{path.relative_to(training_dir).as_posix()}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    gz_buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz_buffer, compresslevel=9, mtime=0) as gz:
        gz.write(tar_buffer.getvalue())
    return gz_buffer.getvalue()


def cached_bundle(training_dir: Path, cache: ContentCache) -> bytes:
    """:func:`build_bundle` of ``training_dir``, built once per content: the cache key is every
    bundled file's relative path and bytes (not its mtime), this module's source, and the
    Python and zlib versions (tarfile and deflate shape the bytes).

    Raises:
      FileNotFoundError: as :func:`build_bundle` (nothing is cached then).
    """
    training_dir = Path(training_dir)
    files = bundle_files(training_dir) if training_dir.is_dir() else []
    if not files:
        return build_bundle(training_dir)
    parts: list[bytes | str] = [Path(__file__).read_bytes(), sys.version, zlib.ZLIB_RUNTIME_VERSION]
    for path in files:
        parts += [path.relative_to(training_dir).as_posix(), path.read_bytes()]
    return cache.get_or_compute("bundle", key_of(*parts), lambda: build_bundle(training_dir))
