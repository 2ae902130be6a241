"""``uv.lock`` as data: its packages indexed by canonical name, dependency edges resolved to
package entries, and each file's URL and sha256.

The lock is uv's TOML lockfile (https://docs.astral.sh/uv/concepts/projects/layout/#the-lockfile):
``[[package]]`` entries with ``name``, ``version``, ``source``, ``dependencies`` (edges with
optional ``marker``, ``extra``, and ``version``/``source`` when a name has several entries),
``optional-dependencies``, ``dev-dependencies`` (dependency groups), ``sdist`` and ``wheels``
(each with ``url`` and ``hash = "sha256:…"``). :mod:`infra.startup.lockfile` walks it to pin the TPU
VMs' requirements.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

#: Project name in pyproject.toml / uv.lock.
PROJECT_NAME = "multislice"


class LockfileError(ValueError):
    """uv.lock cannot give pinned requirements for the target (message names the package)."""


@dataclass(frozen=True)
class Artifact:
    """One file of a locked package: its file name, download URL and sha256 (hex)."""

    filename: str
    url: str
    sha256: str

    @classmethod
    def from_lock_entry(cls, entry: Mapping[str, Any], *, package: str) -> Artifact:
        """The artifact of a ``wheels`` or ``sdist`` entry of ``package`` (``name==version``).

        Raises:
          LockfileError: the entry has no URL (or path) or no sha256 hash.
        """
        url = entry.get("url") or entry.get("path") or entry.get("filename")
        digest = entry.get("hash", "")
        if not url or not digest.startswith("sha256:"):
            raise LockfileError(f"{package}: lock entry {entry!r} has no URL or sha256 hash")
        return cls(filename=str(url).rsplit("/", 1)[-1], url=str(url), sha256=digest[len("sha256:") :])


def package_key(package: Mapping[str, Any]) -> tuple[str, str]:
    """``(canonical name, version)`` of a package entry."""
    return canonicalize_name(package["name"]), str(package.get("version"))


class Lock:
    """A parsed ``uv.lock``: packages indexed by canonical name.

    Raises (constructor):
      LockfileError: the file is missing or not a uv lock.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            data = tomllib.loads(self.path.read_text())
        except FileNotFoundError:
            raise LockfileError(f"{self.path} does not exist; run `uv lock`") from None
        except tomllib.TOMLDecodeError as err:
            raise LockfileError(f"{self.path} is not valid TOML: {err}") from None
        packages = data.get("package")
        if not isinstance(packages, list):
            raise LockfileError(f"{self.path} has no [[package]] entries; is it a uv.lock?")
        self._by_name: dict[str, list[dict[str, Any]]] = {}
        for package in packages:
            self._by_name.setdefault(canonicalize_name(package["name"]), []).append(package)

    def candidates(self, name: str) -> list[dict[str, Any]]:
        return self._by_name.get(canonicalize_name(name), [])

    def project(self, name: str = PROJECT_NAME) -> dict[str, Any]:
        for package in self.candidates(name):
            source = package.get("source", {})
            if "editable" in source or "virtual" in source:
                return package
        raise LockfileError(f"{self.path}: the project {name!r} is not recorded in the lock; run `uv lock`")

    def resolve(self, dependency: Mapping[str, Any], *, context: str) -> dict[str, Any]:
        """The package entry a dependency edge points to (uv adds version/source when a name
        has several entries)."""
        name = dependency["name"]
        found = self.candidates(name)
        if "version" in dependency:
            found = [p for p in found if p.get("version") == dependency["version"]]
        if "source" in dependency:
            found = [p for p in found if p.get("source") == dependency["source"]]
        if not found:
            raise LockfileError(f"{context}: {name!r} is not in {self.path.name}; run `uv lock`")
        if len(found) > 1:
            versions = ", ".join(str(p.get("version")) for p in found)
            raise LockfileError(f"{context}: {name!r} is ambiguous in {self.path.name} (versions {versions})")
        return found[0]
