"""What a killed fake-gcs-server leaves in its filesystem backend, and setting it aside.

fake-gcs-server's filesystem backend writes an object in two steps (``internal/backend/fs.go``,
``CreateObject``, https://github.com/fsouza/fake-gcs-server): the content through renameio (a
temporary ``.<name><random>`` file in the object's directory, renamed into place), then the
object's metadata (the file's ``user.metadata`` extended attribute, or a ``<name>.metadata``
file where the root has no user xattrs); it answers the upload only after both. A server killed
in between leaves a file without metadata: an upload no client was told succeeded, which Cloud
Storage would not list. The next server's ``ListObjects`` reads the metadata of every file
under the listed prefix and answers any failure with HTTP 404 (``fakestorage/object.go``,
``listObjects``), so that one file makes the whole prefix "not found": gcsfs then calls the
run's ``checkpoints/`` directory absent, Orbax lists no step, and a resumed run started over
from step 0 (test_emulation's killed-emulator test once did, 1 run in 14 under load).

:func:`set_aside` moves such files out of the root before a server starts on it; nothing is
deleted, and the caller says what moved.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The extended attribute holding an object's metadata (``internal/backend/metadata_xattr.go``).
XATTR = "user.metadata"
#: The suffix of the metadata file where the root has no user xattrs (``metadata_file.go``).
SIDECAR_SUFFIX = ".metadata"


def _has_metadata(path: Path) -> bool:
    if Path(f"{path}{SIDECAR_SUFFIX}").is_file():
        return True
    try:
        os.getxattr(path, XATTR)
    except OSError:  # ENODATA: none; ENOTSUP: no user xattrs here (then only the sidecar counts)
        return False
    return True


def _is_sidecar(path: Path) -> bool:
    return path.name.endswith(SIDECAR_SUFFIX) and path.with_name(path.name.removesuffix(SIDECAR_SUFFIX)).is_file()


def unacknowledged(root: Path) -> list[Path]:
    """The files under ``root``'s bucket directories that have no object metadata, sorted.

    ``root`` is a fake-gcs-server ``-filesystem-root``: one directory per bucket (the files
    beside them, ``<bucket>.bucketMetadata``, are the buckets' own and are not looked at).
    """
    if not root.is_dir():
        return []
    found = []
    for bucket in sorted(p for p in root.iterdir() if p.is_dir()):
        for directory, _, names in os.walk(bucket):
            for name in names:
                path = Path(directory) / name
                if path.is_file() and not _is_sidecar(path) and not _has_metadata(path):
                    found.append(path)
    return sorted(found)


def set_aside(root: Path, into: Path) -> list[Path]:
    """Move each of :func:`unacknowledged` ``root``'s files to the same relative path under
    ``into``; the moved files' new paths, sorted. Raises OSError when a move fails."""
    moved = []
    for path in unacknowledged(root):
        target = into / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):  # an earlier set-aside's file of that name stays
            if not target.exists():
                break
            target = target.with_name(f"{path.name}.{n}")
        os.replace(path, target)
        moved.append(target)
    return moved
