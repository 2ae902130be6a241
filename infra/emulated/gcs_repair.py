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

import errno
import os
import tempfile
import time
from pathlib import Path

#: The extended attribute holding an object's metadata (``internal/backend/metadata_xattr.go``).
XATTR = "user.metadata"
#: The suffix of the metadata file where the root has no user xattrs (``metadata_file.go``).
SIDECAR_SUFFIX = ".metadata"


def uses_xattrs(root: Path) -> bool:
    """Whether a server on ``root`` keeps metadata in xattrs, decided as it decides
    (``fs.go``, ``NewStorageFS``): reading the attribute on the root works or says it is absent."""
    try:
        os.getxattr(root, XATTR)
    except OSError as err:
        return err.errno == errno.ENODATA
    return True


def _has_metadata(path: Path, xattrs: bool) -> bool:
    if not xattrs:
        return Path(f"{path}{SIDECAR_SUFFIX}").is_file()
    try:
        os.getxattr(path, XATTR)
    except OSError as err:  # ENODATA: none; anything else (a permission): leave the file alone
        return err.errno != errno.ENODATA
    return True


def unacknowledged(root: Path) -> list[Path]:
    """The files under ``root``'s bucket directories that have no object metadata, sorted.

    ``root`` is a fake-gcs-server ``-filesystem-root``: one directory per bucket (the files
    beside them, ``<bucket>.bucketMetadata``, are the buckets' own and are not looked at). Where
    the server keeps metadata in ``<name>.metadata`` files (:func:`uses_xattrs` false), those files
    are its own; where it uses xattrs, they are objects like any other.
    """
    if not root.is_dir():
        return []
    xattrs = uses_xattrs(root)
    found = []
    for bucket in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for directory, _, names in os.walk(bucket):
            for name in names:
                path = Path(directory) / name
                if not xattrs and name.endswith(SIDECAR_SUFFIX):
                    continue
                if path.is_file() and not path.is_symlink() and not _has_metadata(path, xattrs):
                    found.append(path)
    return sorted(found)


def set_aside(root: Path, into: Path) -> tuple[Path | None, list[Path]]:
    """Move each of :func:`unacknowledged` ``root``'s files to the same relative path under a new
    directory of ``into``, one per call (``tempfile.mkdtemp``, its name starting with the UTC
    time): nothing set aside earlier is overwritten. Returns that directory (None when nothing
    was found) and the moved files' paths relative to it, sorted. A file gone meanwhile (another
    start moved it, a live server renamed it) is skipped. Raises OSError when a move fails."""
    found = unacknowledged(root)
    if not found:
        return None, []
    into.mkdir(parents=True, exist_ok=True)
    batch = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()), dir=into))
    moved = []
    for path in found:
        name = path.relative_to(root)
        (batch / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, batch / name)
        except FileNotFoundError:
            continue
        moved.append(name)
    return batch, moved
