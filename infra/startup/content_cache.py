"""A content-addressed on-disk cache for work that depends only on file contents.

``pulumi preview`` evaluates the program in a fresh process every time, as every review command
(``render``, ``plan``, ``check``, ``diff``) builds the release, and part of that work (the trainer
bundle and each of its modules as it ships, the VM's pinned requirements) depends only on files
that rarely change. :class:`ContentCache` stores such a result under the sha256 of everything it depends
on (:func:`key_of`): the input files' bytes, never their mtimes; the source of the code that
computes it; the versions of the libraries it uses. So a changed input or a changed algorithm
is a new key, an unchanged one is a hit, and nothing is ever invalidated by hand.

Concurrent processes are safe: an entry is written to a temporary file in its directory and
renamed into place (``os.replace``, atomic on POSIX: a reader sees the old entry, the new one or
none, never part of one). Each entry starts with the sha256 of its payload, checked on every
read; a mismatch is a miss. The cache only saves time: an unreadable or unwritable directory
means the value is computed, as without a cache.

Location: ``$MULTISLICE_CACHE_DIR``, else ``<project root>/.multislice/cache`` (git-ignored).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that overrides the cache directory.
CACHE_DIR_ENV = "MULTISLICE_CACHE_DIR"

#: Entry layout version (part of every entry's path): ``<sha256 of payload>\n<payload>``.
ENTRY_FORMAT = "v1"


def key_of(*parts: bytes | str) -> str:
    """Hex sha256 of ``parts``, each length-prefixed (so ``("ab", "c")`` and ``("a", "bc")``
    differ); ``str`` parts count as their UTF-8 bytes."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class ContentCache:
    """Entries ``<directory>/<ENTRY_FORMAT>/<namespace>/<key>``; ``namespace`` names the kind
    of value (``bundle``, ``shipped-source``, ``release-xz``, ``vm-pins``), ``key`` comes from :func:`key_of`."""

    directory: Path

    def _path(self, namespace: str, key: str) -> Path:
        return Path(self.directory) / ENTRY_FORMAT / namespace / key

    def get(self, namespace: str, key: str) -> bytes | None:
        """The stored payload, or None (absent, unreadable or failing its checksum)."""
        try:
            data = self._path(namespace, key).read_bytes()
        except OSError:
            return None
        checksum, sep, payload = data.partition(b"\n")
        if not sep or hashlib.sha256(payload).hexdigest().encode() != checksum:
            return None
        return payload

    def put(self, namespace: str, key: str, payload: bytes) -> None:
        """Store ``payload`` atomically (temporary file + rename); an OSError (read-only or
        full disk) leaves the cache as it was."""
        path = self._path(namespace, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)

    def get_or_compute(self, namespace: str, key: str, compute: Callable[[], bytes]) -> bytes:
        """The stored payload of ``key``, else ``compute()`` stored and returned. Exceptions
        of ``compute`` propagate and nothing is stored."""
        payload = self.get(namespace, key)
        if payload is None:
            payload = compute()
            self.put(namespace, key, payload)
        return payload


def for_project(project_root: Path) -> ContentCache:
    """The cache of a checkout: ``$MULTISLICE_CACHE_DIR`` if set, else
    ``<project_root>/.multislice/cache``."""
    override = os.environ.get(CACHE_DIR_ENV)
    return ContentCache(Path(override) if override else Path(project_root) / ".multislice" / "cache")
