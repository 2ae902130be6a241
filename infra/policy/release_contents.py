"""What a stack's release carries, read back from what the program declares, for the secrets scan
(:func:`infra.policy.policies._startup_script_safe`).

A startup script embeds its release as base85 of an xz-compressed tar between the heredoc markers
``<<'MULTISLICE_RELEASE'`` and ``MULTISLICE_RELEASE`` (``infra/startup/startup.sh.in``,
:func:`infra.startup.script.encode_payload`): the trainer's config, or a command's ``workload.json``
(its ``env``), its requirements and, when small enough, its ``source`` files. A larger source
travels as its own tar in the bucket (a ``BucketObject`` under ``multislice/<stack>/sources/``
uploaded from a file). Each reader returns path → bytes, or ``{}`` for what is not such a release
(nothing to scan is not an error: the script's own text is scanned anyway).
"""

from __future__ import annotations

import base64
import io
import lzma
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The embedded payload: the heredoc's body (one line of base85 in practice).
_EMBEDDED = re.compile(r"<<'MULTISLICE_RELEASE'[^\n]*\n(.*?)\nMULTISLICE_RELEASE\n", re.S)
#: At most this many bytes of files are read back from one tar (the release and a source are
#: bounded by the metadata limit and the source limit; this guards against a crafted archive).
MAX_READ_BYTES = 256 * 1024 * 1024


def tar_files(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar, path → bytes (``{}`` when ``data`` is not a readable tar)."""
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                total += member.size
                if total > MAX_READ_BYTES:
                    break
                handle = archive.extractfile(member)
                if handle is not None:
                    files[member.name] = handle.read()
    except (tarfile.TarError, OSError, EOFError):
        return {}
    return files


def stack_content(path: str) -> bool:
    """Whether a release file comes from the stack (its ``training`` config, its command's spec,
    requirements and source), which the secrets scan reads, rather than from this checkout (the
    trainer package, the boot scripts, the pinned requirements of ``uv.lock``)."""
    return path in ("config.json", "workload.json", "workload-requirements.txt") or path.startswith("workload/")


def embedded_release(script: str) -> dict[str, bytes]:
    """The files of the release a startup script embeds (module docstring)."""
    found = _EMBEDDED.search(script)
    if found is None:
        return {}
    try:
        tar = lzma.decompress(base64.b85decode("".join(found.group(1).split())))
    except (ValueError, lzma.LZMAError):
        return {}
    return tar_files(tar)


def asset_files(source: Any) -> dict[str, bytes]:
    """The files of a tar a ``BucketObject`` uploads from a file (a ``pulumi.FileAsset``, or a
    mapping with its ``path``); ``{}`` when it names no readable file."""
    path = source.get("path") if isinstance(source, Mapping) else getattr(source, "path", None)
    if not isinstance(path, str) or not Path(path).is_file():
        return {}
    return tar_files(Path(path).read_bytes())
