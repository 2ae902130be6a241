"""A run directory's objects, read the way ``multislice status`` needs them: one listing per
folder (names, sizes and update times of up to 1,000 objects per request: Cloud Storage's
``objects.list`` page, https://cloud.google.com/storage/docs/json_api/v1/objects/list) and the
few objects it needs fetched concurrently, never a whole log.

The run directory is ``gs://<bucket>/runs/<run name>`` (:func:`infra.naming.run_dir`), read
through gcsfs (https://gcsfs.readthedocs.io/) with the credentials given (or anonymously from
an emulator, ``STORAGE_EMULATOR_HOST``, as the local emulation and the tests serve one); a local
directory is read through fsspec's local file system (same interface).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Seconds one storage request may take.
REQUEST_TIMEOUT_S = 30.0


class StoreError(RuntimeError):
    """The run directory cannot be read; the message says why, in one line."""


@dataclass(frozen=True)
class Entry:
    """One object of a listing: its name relative to the run directory, size in bytes and
    last update (seconds since the epoch; None when the store does not say)."""

    name: str
    size: int
    updated: float | None


def _epoch(info: dict[str, Any]) -> float | None:
    """The update time of a listing entry: gcsfs's ``updated`` (RFC 3339) or a local ``mtime``."""
    value = info.get("updated") or info.get("mtime")
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RunStore:
    """The objects of run directory ``root`` (``gs://bucket/prefix`` or a local path).

    Args:
      credentials: ``google.auth`` credentials for Cloud Storage; None: anonymous when an
        emulator is configured (``STORAGE_EMULATOR_HOST``), else Application Default Credentials.
      project: the project billed for the requests (``gcp:project``).
    """

    def __init__(self, root: str, credentials: Any = None, project: str | None = None):
        self.root = root.rstrip("/")
        if self.root.startswith("gs://"):
            from gcsfs.core import GCSFileSystem  # the plain file system: no bucket-type lookups

            emulator = os.environ.get("STORAGE_EMULATOR_HOST")
            token = credentials if credentials is not None else ("anon" if emulator else "google_default")
            self.fs = GCSFileSystem(
                token=token,
                project=project or "_",
                skip_instance_cache=True,
                use_listings_cache=False,
                requests_timeout=REQUEST_TIMEOUT_S,
                timeout=REQUEST_TIMEOUT_S,
            )
            self._base = self.root[len("gs://") :]
        else:
            from fsspec.implementations.local import LocalFileSystem

            self.fs = LocalFileSystem()
            self._base = os.path.abspath(self.root)

    def __str__(self) -> str:
        return self.root

    def _path(self, name: str) -> str:
        return f"{self._base}/{name}" if name else self._base

    def _why(self, err: BaseException, what: str) -> StoreError:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        return StoreError(f"cannot read {what} of {self.root}: {text}")

    def list(self, folder: str = "") -> list[Entry]:
        """The objects directly in ``folder`` (relative to the run directory; "" for the root),
        sorted by name; [] when there are none. Sub-folders are left out.

        Raises:
          StoreError: the storage refused or did not answer (credentials, permissions, network).
        """
        try:
            infos = self.fs.ls(self._path(folder), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        except Exception as err:  # gcsfs raises HttpError, OSError, aiohttp and google-auth errors
            raise self._why(err, f"the listing of {folder or 'the run directory'}") from None
        prefix = self._base + "/"
        entries = [
            Entry(str(info["name"])[len(prefix) :], int(info.get("size") or 0), _epoch(info))
            for info in infos
            if info.get("type") == "file" and str(info["name"]).startswith(prefix)
        ]
        return sorted(entries, key=lambda entry: entry.name)

    def list_many(self, folders: list[str]) -> dict[str, list[Entry]]:
        """:meth:`list` of each folder, concurrently."""
        with ThreadPoolExecutor(max_workers=max(1, len(folders))) as pool:
            return dict(zip(folders, pool.map(self.list, folders)))

    def read(self, names: list[str]) -> dict[str, bytes]:
        """The bytes of each object of ``names`` that exists (one concurrent batch).

        Raises:
          StoreError: as :meth:`list`.
        """
        if not names:
            return {}
        paths = {self._path(name): name for name in names}
        try:
            found = self.fs.cat(list(paths), on_error="return")
        except Exception as err:
            raise self._why(err, "objects") from None
        blobs = {}
        for path, value in found.items():
            if isinstance(value, FileNotFoundError):
                continue
            if isinstance(value, BaseException):
                raise self._why(value, paths.get(path, path))
            blobs[paths[path]] = value
        return blobs
