"""Reproducible archives for the VMs: the trainer bundle, the release payload, its compression.

A **release** is everything a TPU VM runs for a stack: the boot logic, the trainer package
(``training/*.py``), the trainer config and the pinned requirements. The startup script
(:mod:`infra.startup`) carries it as one uncompressed tar (:func:`build_archive`), compressed
with xz (:func:`compress`) and base85-encoded; the VM checks the sha256 of the *uncompressed*
tar before unpacking it. That sha256 is the **release id**: it depends on the content only,
never on the compressor, so two operators whose lzma/zlib builds compress differently render
scripts with the same release id (``infra.queued_resource`` keeps the recorded script when
only the compressed bytes differ), and the release record in the bucket
(:mod:`infra.components.release`) stores the uncompressed tar.

Equal inputs give equal bytes: entries sorted by name, regular files only, mtime 0,
uid/gid 0, no user/group names, mode 0644, POSIX ustar format (no PAX headers, which could
carry times).

The expensive step, xz at its highest preset, is done once per content
(:func:`cached_compress`, :mod:`infra.startup.content_cache`); so are the trainer bundle
(:func:`cached_bundle`) and each shipped module's stripping (:func:`cached_stripper`).
"""

from __future__ import annotations

import io
import lzma
import re
import sys
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path

from infra.startup import shipped_source
from infra.startup.content_cache import ContentCache, key_of
from infra.startup.shipped_source import strip_documentation

#: Name of the trainer package inside the bundle (``python -m training``).
BUNDLE_PACKAGE = "training"

#: The line of a rendered startup script (infra/startup/startup.sh.in) that names its release.
RELEASE_LINE = re.compile(r"^readonly RELEASE_ID=([0-9a-f]{64})$", re.M)

#: xz preset of :func:`compress`: level 9 with the "extreme" flag (xz(1), ``-9e``), the
#: smallest output of the stock presets; decompressing it needs 65 MiB of memory.
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def release_id_of(script_text: str) -> str | None:
    """The release id a rendered startup script carries, or None (not one of ours, or from
    before releases had ids). Equal ids mean equal content whatever compressed it."""
    match = RELEASE_LINE.search(script_text)
    return match.group(1) if match else None


#: Packages of ``training/`` that run only on the user's machine, never on a TPU VM: ``data
#: prepare`` (``multislice data prepare`` / ``python -m training data prepare``: the package
#: ``training.prepare``) tokenizes a corpus once, and the VMs only read its shards
#: (``training.data.tokens``). Leaving the whole folder out keeps the startup script under its size
#: target and the ``tokenizers`` package off the VMs' pins.
MACHINE_ONLY_PACKAGES: frozenset[str] = frozenset({"prepare"})


def is_machine_only(relative: str) -> bool:
    """True for a POSIX path relative to ``training/`` inside one of :data:`MACHINE_ONLY_PACKAGES`."""
    return relative.split("/", 1)[0] in MACHINE_ONLY_PACKAGES


def bundle_files(training_dir: Path) -> list[Path]:
    """The files that go into the bundle: ``*.py`` under ``training_dir`` (recursively, no
    ``__pycache__``, nothing in :data:`MACHINE_ONLY_PACKAGES`), sorted by their
    POSIX path relative to it."""
    training_dir = Path(training_dir)
    files = [
        p
        for p in training_dir.rglob("*.py")
        if p.is_file()
        and "__pycache__" not in p.relative_to(training_dir).parts
        and not is_machine_only(p.relative_to(training_dir).as_posix())
    ]
    return sorted(files, key=lambda p: p.relative_to(training_dir).as_posix())


def trainer_files(training_dir: Path, cache: ContentCache | None = None) -> dict[str, bytes]:
    """``{"training/<relative path>": content}`` for :func:`bundle_files`, each as it ships:
    docstrings and comments blanked, line numbers kept (:mod:`infra.startup.shipped_source`),
    with ``cache`` once per content (:func:`cached_stripper`).

    Raises:
      FileNotFoundError: ``training_dir`` is missing or holds no ``*.py`` file.
    """
    training_dir = Path(training_dir)
    files = bundle_files(training_dir) if training_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no *.py files under {training_dir}: nothing to bundle")
    strip = strip_documentation if cache is None else cached_stripper(cache)
    return {f"{BUNDLE_PACKAGE}/{p.relative_to(training_dir).as_posix()}": strip(p.read_bytes()) for p in files}


def cached_stripper(cache: ContentCache) -> Callable[[bytes], bytes]:
    """:func:`~infra.startup.shipped_source.strip_documentation`, done once per content: the
    cache key is the module's bytes, the source of :mod:`~infra.startup.shipped_source` and the
    Python version (its ``ast`` and ``tokenize`` read the source). Every command that builds a
    release strips the trainer's modules (a quarter of a second of CPU for ``training/``); a
    changed module is stripped again, the others are read back. A source that is not valid
    Python raises ``SyntaxError`` as the uncached function does (nothing is cached)."""
    code = Path(shipped_source.__file__).read_bytes()

    def strip(source: bytes) -> bytes:
        key = key_of(code, sys.version, source)
        return cache.get_or_compute("shipped-source", key, lambda: strip_documentation(source))

    return strip


def build_archive(files: Mapping[str, bytes]) -> bytes:
    """A reproducible, uncompressed ustar archive of ``files`` (archive path → content).

    Raises:
      ValueError: a path is absolute, has ``..``, or is too long for ustar (the message names it).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"archive path {name!r} must be relative and without '..'")
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_bundle(training_dir: Path, cache: ContentCache | None = None) -> bytes:
    """The trainer package alone as a reproducible uncompressed tar (``training/…`` entries,
    see :func:`build_archive`); its sha256 is the ``bundleSha256`` the program exports. Each
    module stripped once per content with ``cache`` (:func:`trainer_files`).

    Raises:
      FileNotFoundError: ``training_dir`` is missing or holds no ``*.py`` file.
    """
    return build_archive(trainer_files(training_dir, cache))


def compress(data: bytes, preset: int = XZ_PRESET) -> bytes:
    """``data`` as an xz stream (``xz -dc`` on the VM decompresses it; xz-utils is a
    required package of Debian and Ubuntu): LZMA2 at ``preset`` with ``pb=0`` (no position
    alignment, xz(1) "pb=0 is good for text"; the release is text), about 100 bytes less than
    the preset alone. The bytes depend on the liblzma build and the preset; nothing compares
    them (see the module docstring)."""
    filters = [{"id": lzma.FILTER_LZMA2, "preset": preset, "pb": 0}]
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=filters)


def cached_bundle(training_dir: Path, cache: ContentCache) -> bytes:
    """:func:`build_bundle` of ``training_dir``, built once per content: the cache key is every
    bundled file's relative path and bytes (not its mtime), this module's source and the
    Python version (tarfile shapes the bytes).

    Raises:
      FileNotFoundError: as :func:`build_bundle` (nothing is cached then).
    """
    training_dir = Path(training_dir)
    files = bundle_files(training_dir) if training_dir.is_dir() else []
    if not files:
        return build_bundle(training_dir)
    parts: list[bytes | str] = [Path(__file__).read_bytes(), sys.version]
    for path in files:
        parts += [path.relative_to(training_dir).as_posix(), path.read_bytes()]
    return cache.get_or_compute("bundle", key_of(*parts), lambda: build_bundle(training_dir, cache))


def cached_compress(data: bytes, cache: ContentCache, preset: int = XZ_PRESET) -> bytes:
    """:func:`compress` of ``data``, compressed once per content: the cache key is ``data``,
    the preset, this module's source and the Python version (its lzma module and liblzma
    build shape the bytes). A cached stream from another liblzma build would differ in bytes
    only, never in what it decompresses to (the VM checks the release id of the result).
    """
    key = key_of(Path(__file__).read_bytes(), sys.version, str(preset), data)
    return cache.get_or_compute("release-xz", key, lambda: compress(data, preset))
