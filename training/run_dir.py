"""The run directory: a local path or a ``gs://`` URI behind one interface (etils.epath).

Layout (``training.checkpoint.manager``, ``training.metrics.run_log``)::

    <run>/checkpoints/<step>/    Orbax checkpoints
    <run>/train_config.json      the TrainConfig of the run
    <run>/metrics/<n>.jsonl      records of one sync window each, n = 00000000, 00000001, ...
    <run>/events/<n>.jsonl       start / checkpoint / preempted / complete records
    <run>/tensorboard/           TensorBoard event files, one per sync window
    <run>/COMPLETE               written once the last step's checkpoint is finalized

Every file is written whole and never appended to (Cloud Storage objects cannot be):
:meth:`RunDir.write` uploads one object (an object write is atomic: readers see the old or
the new object, https://cloud.google.com/storage/docs/consistency) or, on a local disk,
renames a synced temporary file over the target.
"""

from __future__ import annotations

import os
import uuid

from etils import epath

from training.run_objects import file_bytes


def fsspec_filesystem(path: epath.Path):
    """The fsspec filesystem etils.epath uses for ``path`` (gcsfs on ``gs://``), or None for a local path."""
    filesystem = getattr(getattr(path, "_backend", None), "fs", None)  # etils.epath's fsspec backend
    return filesystem(os.fspath(path)) if filesystem is not None else None


def drop_listing_cache(path: str | os.PathLike[str] | epath.Path) -> None:
    """Forget the directory listings this process's fsspec filesystem of ``path`` cached
    (gcsfs on ``gs://``); the next listing asks the server. Nothing for a local path."""
    fs = fsspec_filesystem(epath.Path(path))
    if fs is not None:
        fs.invalidate_cache()


class RunDirError(ValueError):
    """The run directory argument cannot be a run directory."""


class RunDir:
    """Run directory ``root`` (local path or ``gs://bucket/prefix``).

    Raises:
      RunDirError: ``root`` is empty, or a local path that is a file.
    """

    def __init__(self, root: str):
        if not root.strip():
            raise RunDirError("the run directory is empty; give a local directory or a gs:// URI")
        self.root = root.rstrip("/")
        self.remote = "://" in root
        self.path = epath.Path(self.root)
        if not self.remote and os.path.exists(root) and not os.path.isdir(root):
            raise RunDirError(f"the run directory {root} is a file, not a directory")

    def __str__(self) -> str:
        return self.root

    def __truediv__(self, name: str) -> epath.Path:
        return self.path / name

    def read(self, name: str) -> bytes | None:
        """The bytes of ``<run>/<name>``, or None if it does not exist. A local object is read by
        :func:`training.run_objects.file_bytes`: a FIFO, a device or a file over
        :data:`~training.run_objects.MAX_OBJECT_BYTES` (more than any reader decodes) is refused
        unread, as an :class:`~training.run_objects.UnreadableObject` (an ``OSError`` and a
        ``ValueError``: a reader that takes a damaged object as absent takes this one so too)."""
        try:
            if not self.remote:
                return file_bytes(self.path / name)
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        """Write ``<run>/<name>`` whole and atomically (see the module docstring)."""
        target = self.path / name
        if self.remote:
            target.write_bytes(data)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{target}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    def create(self, name: str, data: bytes) -> bool:
        """Write ``<run>/<name>`` whole only if it does not exist yet: True if this call created it,
        False if it was there (another writer's, even one racing this call: exactly one of them
        gets True). On ``gs://`` one upload with ``ifGenerationMatch=0`` (gcsfs' ``mode="create"``;
        Cloud Storage answers 412 when the object exists: https://cloud.google.com/storage/docs/
        request-preconditions); on a local disk a synced temporary file hard-linked to the name
        (``link`` fails where the name exists), so a reader never sees part of it.

        Raises:
          OSError: the write itself failed.
        """
        target = self.path / name
        if self.remote:
            fs = fsspec_filesystem(target)
            if fs is None:
                import fsspec

                fs = fsspec.filesystem(self.root.split("://", 1)[0])
            try:
                fs.pipe_file(os.fspath(target), data, mode="create")
            except FileExistsError:
                return False
            return True
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"  # one per writer, threads of one process too
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def list(self, pattern: str) -> list[str]:
        """Names (relative to the run directory) matching the glob ``pattern``, sorted.

        A fresh listing each call: gcsfs answers ``iterdir`` from a cache of earlier listings,
        which would miss what other processes wrote since; ``glob`` asks the server. It also fills
        that cache, which Orbax's listing of checkpoints would then answer from (a restore that
        misses a newer step); so the cache is dropped afterwards.
        """
        names = sorted(str(p)[len(self.root) + 1 :] for p in self.path.glob(pattern))
        if self.remote:
            drop_listing_cache(self.path)
        return names
