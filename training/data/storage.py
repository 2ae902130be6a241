"""Reading and writing a prepared dataset's objects, local or ``gs://``, through one interface.

A dataset lives under a root that is a local directory or a Cloud Storage prefix
(``gs://bucket/datasets/<name>``). Cloud Storage is reached through fsspec's gcsfs, the client
etils.epath (the run directory, Orbax's metadata) already uses, so the same settings point both
at an emulator (``STORAGE_EMULATOR_HOST``, https://gcsfs.readthedocs.io/en/latest/#emulators).

* Whole writes are atomic: a local file is written to ``<name>.tmp-<pid>``, synced and renamed
  over the target (``os.replace`` is atomic on POSIX); a Cloud Storage object is uploaded in one
  request or one resumable upload, and an object becomes visible only when its upload is
  complete ("Strong global consistency", https://cloud.google.com/storage/docs/consistency).
  So a reader never sees half a shard under its final name.
* Ranged reads: ``os.pread`` on a cached descriptor locally; on Cloud Storage fsspec's
  ``cat_ranges``, which sends one ranged ``GET`` (``Range: bytes=a-b``) per range, concurrently
  (https://filesystem-spec.readthedocs.io/en/latest/api.html#fsspec.spec.AbstractFileSystem.cat_ranges):
  a reader fetches only the bytes it asked for, never a whole shard.
* :meth:`Storage.info` gives an object's size and, on Cloud Storage, the MD5 the service
  computed of the bytes it stores (``md5Hash``, base64; https://cloud.google.com/storage/docs/
  json_api/v1/objects): a shard is checked against its manifest without downloading it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import threading
from pathlib import Path

from training.run_objects import file_bytes, open_regular


class StorageError(OSError):
    """An object of a dataset cannot be read or written; the message names it."""


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    size: int  # bytes
    md5: str | None  # base64 MD5 of the content as Cloud Storage reports it; None locally


def md5_base64(data_or_digest: bytes, *, digest: bool = False) -> str:
    """Base64 of an MD5 digest, the form of Cloud Storage's ``md5Hash``."""
    raw = data_or_digest if digest else hashlib.md5(data_or_digest).digest()
    return base64.b64encode(raw).decode()


def _open_regular_file(path: str, mode: str):
    """The local file ``path`` opened ``mode`` (``rb``) only if it is a regular file (a FIFO would block
    the open): :func:`training.run_objects.open_regular`."""
    return os.fdopen(open_regular(path), mode)


class Storage:
    """The objects under ``root`` (a local directory or ``gs://bucket/prefix``).

    Names are ``/``-separated paths relative to the root (``train/00000.bin``).
    """

    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.remote = "://" in root
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        if self.remote:
            import fsspec

            self.fs, self._base = fsspec.core.url_to_fs(self.root)
        else:
            self.fs, self._base = None, self.root

    def __str__(self) -> str:
        return self.root

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _path(self, name: str) -> str:
        return f"{self._base}/{name}"

    def read(self, name: str) -> bytes | None:
        """The whole object ``name``, or None if it does not exist. A local one is read by
        :func:`training.run_objects.file_bytes`: a regular file of at most
        :data:`~training.run_objects.MAX_OBJECT_BYTES` (a manifest, a plan, a tokenizer file;
        the largest, a tokenizer's JSON, is tens of MB).

        Raises:
          StorageError: it exists but cannot be read (a FIFO, a device, over the limit).
        """
        try:
            if self.fs is not None:
                return self.fs.cat_file(self._path(name))
            return file_bytes(self._path(name))
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StorageError(f"cannot read {self.uri(name)}: {err}") from None

    def info(self, name: str) -> ObjectInfo | None:
        """Size (and remote MD5) of ``name``, or None if it does not exist (a fresh lookup)."""
        try:
            if self.fs is not None:
                self.fs.invalidate_cache(self._path(name))
                meta = self.fs.info(self._path(name))
                return ObjectInfo(int(meta["size"]), meta.get("md5Hash"))
            return ObjectInfo(os.stat(self._path(name)).st_size, None)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.info(name) is not None

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``name`` whole and atomically (module docstring)."""
        if self.fs is not None:
            self.fs.pipe_file(self._path(name), data)
            return
        target = Path(self._path(name))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    def local_staging(self, name: str) -> Path:
        """Where to write ``name`` before :meth:`commit`: next to the target locally (same file
        system, so the rename is atomic), else a temporary file of this machine."""
        if self.fs is not None:
            import tempfile

            handle, path = tempfile.mkstemp(prefix="shard-", suffix=".tmp")
            os.close(handle)
            return Path(path)
        target = Path(self._path(name))
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f"{target.name}.tmp-*"):  # left by an interrupted writer
            stale.unlink(missing_ok=True)
        return target.with_name(f"{target.name}.tmp-{os.getpid()}")

    def commit(self, staged: Path, name: str) -> None:
        """Make the synced file ``staged`` the object ``name`` (atomically; module docstring)."""
        if self.fs is not None:
            try:
                self.fs.put_file(str(staged), self._path(name))
            finally:
                staged.unlink(missing_ok=True)
            return
        os.replace(staged, self._path(name))

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        try:
            if self.fs is not None:
                self.fs.rm_file(self._path(name))
            else:
                os.unlink(self._path(name))
        except FileNotFoundError:
            pass

    def read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes ``[start, end)`` of each ``(name, start, end)``, in order.

        Raises:
          StorageError: an object is missing or shorter than a range (naming it).
        """
        if self.fs is not None:
            paths = [self._path(name) for name, _, _ in ranges]
            chunks = self.fs.cat_ranges(
                paths, [start for _, start, _ in ranges], [end for _, _, end in ranges], on_error="return"
            )
        else:
            chunks = [self._pread(name, start, end) for name, start, end in ranges]
        for (name, start, end), chunk in zip(ranges, chunks, strict=True):
            if isinstance(chunk, BaseException):
                raise StorageError(f"cannot read bytes {start}-{end} of {self.uri(name)}: {chunk}")
            if len(chunk) != end - start:
                raise StorageError(
                    f"{self.uri(name)} is shorter than its manifest says: bytes {start}-{end} gave {len(chunk)} "
                    "(a truncated or replaced shard; prepare the dataset again)"
                )
        return chunks  # type: ignore[return-value]  # errors were raised above

    def _pread(self, name: str, start: int, end: int) -> bytes | BaseException:
        try:
            with self._lock:
                fd = self._fds.get(name)
                if fd is None:  # a regular file (a FIFO there would block the open): run_objects.open_regular
                    fd = self._fds[name] = open_regular(self._path(name))
            return os.pread(fd, end - start, start)
        except OSError as err:
            return err

    def sha256(self, name: str) -> str:
        """Hex sha256 of the whole object (read in 8 MiB blocks)."""
        digest = hashlib.sha256()
        opener = self.fs.open if self.fs is not None else _open_regular_file
        with opener(self._path(name), "rb") as f:
            while block := f.read(8 << 20):
                digest.update(block)
        return digest.hexdigest()

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
