"""Pinned requirements for the TPU VMs, read from ``uv.lock``.

The startup script (``infra/startup.py``) installs the trainer's dependencies on every TPU VM
with ``uv pip install --require-hashes``. The pins come from the same ``uv.lock`` that
``uv sync`` uses here, so the VM runs exactly the versions the tests ran against.

``uv export --extra tpu`` would give the same versions, but with a hash for every file of
every version (~170 KB, DESIGN.md "Cloud TPU API"), too much for a startup script that must
stay far below the 256 KiB GCE metadata limit. So this module walks the lock itself:

1. roots: :data:`TRAINER_REQUIREMENTS` (the trainer's direct dependencies) plus the
   project's ``tpu`` extra (``jax[tpu]``, ``gcsfs``) as recorded for the project in the lock;
2. closure: follow ``dependencies`` and requested ``optional-dependencies`` (extras) through
   the lock, keeping only edges whose PEP 508 marker holds on the target environment
   (:class:`TargetEnvironment`: CPython of ``.python-version`` on Linux x86_64);
3. artifacts: per package keep only the wheels whose tags the target accepts
   (``packaging.tags``); fall back to the sdist only when no wheel matches.

The output is deterministic: packages sorted by name, hashes sorted, no timestamps.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

#: The trainer's direct requirements (``training/`` imports these). pyproject.toml lists
#: them again in ``[project] dependencies``; tests/test_lockfile.py keeps the two in step.
TRAINER_REQUIREMENTS: tuple[str, ...] = (
    "jax",
    "optax",
    "orbax-checkpoint",
    "grain",
    "numpy",
    "pydantic",
    "typer",
    "tensorboardX",
)

#: The project's extra that a TPU VM installs on top (``jax[tpu]`` → libtpu, ``gcsfs``).
TPU_EXTRA = "tpu"

#: The dependency group of the project that pins ``uv`` itself.
UV_GROUP = "dev"

#: Project name in pyproject.toml / uv.lock.
PROJECT_NAME = "multislice"

#: Highest glibc of the target: Cloud TPU VM base images are Ubuntu 22.04 (glibc 2.35).
#: libtpu needs manylinux_2_31, jaxlib manylinux_2_27.
TARGET_GLIBC: tuple[int, int] = (2, 35)

# Legacy manylinux names (PEP 600): manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


class LockfileError(ValueError):
    """uv.lock cannot give pinned requirements for the target (message names the package)."""


# Target environment --------------------------------------------------------------------------


def read_python_version(project_root: Path) -> str:
    """The Python version the project pins in ``.python-version`` (e.g. ``"3.11"``).

    Raises:
      LockfileError: the file is missing or holds no ``X.Y`` / ``X.Y.Z`` version.
    """
    path = Path(project_root) / ".python-version"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise LockfileError(f"{path} does not exist; it names the Python version of the TPU VMs") from None
    for line in lines:
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        parts = value.split(".")
        if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
            raise LockfileError(f"{path}: {value!r} is not a CPython version like '3.11' or '3.11.9'")
        return value
    raise LockfileError(f"{path} is empty; write a CPython version like '3.11'")


@dataclass(frozen=True)
class TargetEnvironment:
    """Where the pinned requirements will be installed: CPython ``python_version`` on
    glibc Linux x86_64 (a Cloud TPU VM).

    Attributes:
      python_version: ``"3.11"`` or ``"3.11.9"`` (as in ``.python-version``).
      glibc: highest glibc version (major, minor) of the target.
    """

    python_version: str
    glibc: tuple[int, int] = TARGET_GLIBC

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.python_version.split(".")[:2]
        return int(major), int(minor)

    @property
    def description(self) -> str:
        major, minor = self.major_minor
        return f"CPython {self.python_version} (cp{major}{minor}) on manylinux_{self.glibc[0]}_{self.glibc[1]} x86_64"

    def marker_environments(self) -> list[dict[str, str]]:
        """PEP 508 marker environments of the target.

        With ``"3.11"`` the patch release is whatever ``uv python install`` picks on the VM,
        so two environments are returned (``3.11.0`` and ``3.11.99``); a marker must agree on
        both (:meth:`evaluate`).
        """
        if self.python_version.count(".") == 2:
            full_versions = [self.python_version]
        else:
            full_versions = [f"{self.python_version}.0", f"{self.python_version}.99"]
        major, minor = self.major_minor
        return [
            {
                "implementation_name": "cpython",
                "implementation_version": full,
                "os_name": "posix",
                "platform_machine": "x86_64",
                "platform_python_implementation": "CPython",
                "platform_release": "",
                "platform_system": "Linux",
                "platform_version": "",
                "python_full_version": full,
                "python_version": f"{major}.{minor}",
                "sys_platform": "linux",
                "extra": "",
            }
            for full in full_versions
        ]

    def evaluate(self, marker: str | None, *, context: str) -> bool:
        """Whether a PEP 508 marker holds on the target.

        Raises:
          LockfileError: the marker's value depends on the Python patch release (pin a full
            version in ``.python-version``), or it does not parse.
        """
        if not marker:
            return True
        try:
            parsed = Marker(marker)
        except Exception as err:  # packaging.markers.InvalidMarker
            raise LockfileError(f"{context}: invalid marker {marker!r}: {err}") from None
        results = {parsed.evaluate(dict(env)) for env in self.marker_environments()}
        if len(results) > 1:
            raise LockfileError(
                f"{context}: marker {marker!r} depends on the patch release of Python "
                f"{self.python_version}; pin a full version (e.g. {self.python_version}.9) in .python-version"
            )
        return results.pop()

    @cached_property
    def platforms(self) -> tuple[str, ...]:
        """Platform tags, most specific first (``manylinux_2_35_x86_64`` … ``linux_x86_64``)."""
        major, top = self.glibc
        names: list[str] = []
        for minor in range(top, 4, -1):
            names.append(f"manylinux_{major}_{minor}_x86_64")
            if minor in _LEGACY_MANYLINUX:
                names.append(f"{_LEGACY_MANYLINUX[minor]}_x86_64")
        names.append("linux_x86_64")
        return tuple(names)

    @cached_property
    def tags(self) -> tuple[Tag, ...]:
        """Wheel tags the target accepts, in installer priority order (best first).

        Built with ``packaging.tags`` for the target, not the running interpreter: the ABI
        list is given explicitly (``cpXY``, plus ``abi3``/``none`` which packaging adds).
        """
        major, minor = self.major_minor
        version = (major, minor)
        interpreter = f"cp{major}{minor}"
        tags = list(cpython_tags(version, abis=[interpreter], platforms=self.platforms))
        tags += list(compatible_tags(version, interpreter, self.platforms))
        return tuple(dict.fromkeys(tags))

    @cached_property
    def _rank(self) -> dict[Tag, int]:
        return {tag: i for i, tag in enumerate(self.tags)}

    def wheel_rank(self, filename: str) -> int | None:
        """Priority of a wheel on the target (lower is better), or None if it cannot install."""
        try:
            _, _, _, wheel_tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            return None
        ranks = [self._rank[t] for t in wheel_tags if t in self._rank]
        return min(ranks) if ranks else None


def target_environment(project_root: Path | None = None) -> TargetEnvironment:
    """The TPU VM target: CPython of ``.python-version`` on Linux x86_64."""
    return TargetEnvironment(read_python_version(project_root or default_project_root()))


# Lock reading ---------------------------------------------------------------------------------


def default_project_root() -> Path:
    """The checkout this module lives in (holds pyproject.toml, uv.lock, training/)."""
    return Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Artifact:
    """One file of a locked package: its file name, download URL and sha256 (hex)."""

    filename: str
    url: str
    sha256: str


@dataclass(frozen=True)
class PinnedPackage:
    """A package of the closure and the artifacts the target may install.

    ``artifacts`` are the target-compatible wheels, best first, or the sdist when no wheel
    fits (``from_sdist`` is then True).
    """

    name: str
    version: str
    artifacts: tuple[Artifact, ...]
    from_sdist: bool = False

    @property
    def hashes(self) -> tuple[str, ...]:
        return tuple(sorted({a.sha256 for a in self.artifacts}))

    def requirement_lines(self) -> str:
        """``name==version \\`` followed by one ``--hash=sha256:…`` line per artifact."""
        hashes = self.hashes
        lines = [f"{self.name}=={self.version}" + (" \\" if hashes else "")]
        for i, digest in enumerate(hashes):
            lines.append(f"    --hash=sha256:{digest}" + (" \\" if i < len(hashes) - 1 else ""))
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class PinnedRequirements:
    """The pinned closure of the trainer's requirements for one target.

    Attributes:
      packages: sorted by name.
      target: the environment the pins were evaluated for.
      roots: canonical names of the requested roots.
    """

    packages: tuple[PinnedPackage, ...]
    target: TargetEnvironment
    roots: tuple[str, ...] = field(default=())

    @cached_property
    def text(self) -> str:
        """requirements.txt text for ``uv pip install --require-hashes -r``."""
        header = (
            f"# Trainer requirements for {self.target.description}.\n"
            "# Generated by infra/lockfile.py from uv.lock; do not edit.\n"
        )
        return header + "".join(p.requirement_lines() for p in self.packages)

    @property
    def sha256(self) -> str:
        """sha256 (hex) of :attr:`text` encoded as UTF-8."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.packages)

    def __getitem__(self, name: str) -> PinnedPackage:
        key = canonicalize_name(name)
        for package in self.packages:
            if package.name == key:
                return package
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and canonicalize_name(name) in self.names


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel pinned by the lock (used for ``uv`` itself)."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str

    @property
    def requirement_text(self) -> str:
        """A one-requirement file for ``pip install --require-hashes -r``."""
        return f"{self.name}=={self.version} \\\n    --hash=sha256:{self.sha256}\n"


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


def _key(package: Mapping[str, Any]) -> tuple[str, str]:
    return canonicalize_name(package["name"]), str(package.get("version"))


def _artifact(entry: Mapping[str, Any], *, package: str) -> Artifact:
    url = entry.get("url") or entry.get("path") or entry.get("filename")
    digest = entry.get("hash", "")
    if not url or not digest.startswith("sha256:"):
        raise LockfileError(f"{package}: lock entry {entry!r} has no URL or sha256 hash")
    return Artifact(filename=str(url).rsplit("/", 1)[-1], url=str(url), sha256=digest[len("sha256:") :])


def _select_artifacts(package: Mapping[str, Any], target: TargetEnvironment) -> PinnedPackage:
    name, version = _key(package)
    label = f"{name}=={version}"
    source = package.get("source", {})
    if "registry" not in source:
        raise LockfileError(
            f"{label}: source {source!r} is not a package index; the VM can only install registry packages"
        )
    ranked = []
    for entry in package.get("wheels", []):
        artifact = _artifact(entry, package=label)
        rank = target.wheel_rank(artifact.filename)
        if rank is not None:
            ranked.append((rank, artifact.filename, artifact))
    if ranked:
        ranked.sort()
        return PinnedPackage(name, version, tuple(a for _, _, a in ranked))
    if "sdist" in package:
        return PinnedPackage(name, version, (_artifact(package["sdist"], package=label),), from_sdist=True)
    raise LockfileError(f"{label}: no wheel for {target.description} and no sdist in the lock")


def _project_edges(lock: Lock, roots: Iterable[str], extras: Sequence[str]) -> list[dict[str, Any]]:
    """The project's dependency edges for ``roots`` plus all edges of ``extras``."""
    project = lock.project()
    edges: list[dict[str, Any]] = []
    deps = project.get("dependencies", [])
    for root in roots:
        matching = [d for d in deps if canonicalize_name(d["name"]) == canonicalize_name(root)]
        if not matching:
            raise LockfileError(
                f"trainer requirement {root!r} is not a dependency of {PROJECT_NAME} in {lock.path.name}; "
                "add it to pyproject.toml [project] dependencies and run `uv lock`"
            )
        edges += matching
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            known = ", ".join(sorted(optional)) or "none"
            raise LockfileError(f"extra {extra!r} of {PROJECT_NAME} is not in {lock.path.name} (extras: {known})")
        edges += optional[extra]
    return edges


def pinned_requirements(
    project_root: Path | None = None,
    *,
    target: TargetEnvironment | None = None,
    roots: Sequence[str] = TRAINER_REQUIREMENTS,
    extras: Sequence[str] = (TPU_EXTRA,),
) -> PinnedRequirements:
    """Pin the closure of ``roots`` (+ the project's ``extras``) from ``uv.lock``.

    Args:
      project_root: directory with ``uv.lock`` and ``.python-version``; default: this checkout.
      target: environment to evaluate markers and wheel tags for; default from ``.python-version``.
      roots: distribution names that must be dependencies of the project in the lock.
      extras: extras of the project whose dependencies are added (default ``("tpu",)``).

    Returns:
      PinnedRequirements, packages sorted by name; ``.text`` is a requirements file with one
      ``--hash`` per target-compatible wheel (or the sdist if no wheel fits).

    Raises:
      LockfileError: a root or extra missing from the lock, an unresolvable edge, an ambiguous
        marker, or a package with no artifact for the target (the message names it).
    """
    root_dir = Path(project_root) if project_root is not None else default_project_root()
    target = target or target_environment(root_dir)
    lock = Lock(root_dir / "uv.lock")

    queue: list[tuple[dict[str, Any], str]] = []
    for edge in _project_edges(lock, roots, extras):
        if target.evaluate(edge.get("marker"), context=f"{PROJECT_NAME} → {edge['name']}"):
            queue.append((edge, PROJECT_NAME))

    packages: dict[tuple[str, str], dict[str, Any]] = {}
    active_extras: dict[tuple[str, str], set[str]] = {}
    while queue:
        edge, parent = queue.pop(0)
        context = f"{parent} → {edge['name']}"
        package = lock.resolve(edge, context=context)
        key = _key(package)
        wanted = set(edge.get("extra", []))
        seen = active_extras.get(key)
        if seen is not None and wanted <= seen:
            continue
        new_extras = wanted - (seen or set())
        packages[key] = package
        active_extras[key] = (seen or set()) | wanted
        label = f"{key[0]}=={key[1]}"
        children: list[dict[str, Any]] = []
        if seen is None:
            children += package.get("dependencies", [])
        optional = package.get("optional-dependencies", {})
        for extra in sorted(new_extras):
            if extra not in optional:
                raise LockfileError(f"{context}: extra [{extra}] of {label} is not in {lock.path.name}")
            children += optional[extra]
        for child in children:
            if target.evaluate(child.get("marker"), context=f"{label} → {child['name']}"):
                queue.append((child, label))

    names = [k[0] for k in packages]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise LockfileError(f"two versions of {', '.join(duplicates)} selected for {target.description}")
    pinned = tuple(sorted((_select_artifacts(p, target) for p in packages.values()), key=lambda p: p.name))
    canonical_roots = tuple(canonicalize_name(r) for r in roots)
    return PinnedRequirements(packages=pinned, target=target, roots=canonical_roots)


def pinned_uv(
    project_root: Path | None = None,
    *,
    target: TargetEnvironment | None = None,
    group: str = UV_GROUP,
) -> PinnedWheel:
    """The ``uv`` wheel that the lock pins in the project's ``group`` dependency group, for
    the target (Linux x86_64; uv wheels are ``py3-none``, so any system Python 3 installs it).

    Raises:
      LockfileError: uv is not in the group, or no uv wheel fits the target.
    """
    root_dir = Path(project_root) if project_root is not None else default_project_root()
    target = target or target_environment(root_dir)
    lock = Lock(root_dir / "uv.lock")
    project = lock.project()
    edges = [d for d in project.get("dev-dependencies", {}).get(group, []) if canonicalize_name(d["name"]) == "uv"]
    edges = [d for d in edges if target.evaluate(d.get("marker"), context=f"{PROJECT_NAME} → uv")]
    if not edges:
        raise LockfileError(
            f"uv is not in the {group!r} dependency group of {PROJECT_NAME} in {lock.path.name}; "
            f"add it to pyproject.toml [dependency-groups] {group} and run `uv lock`"
        )
    package = lock.resolve(edges[0], context=f"{PROJECT_NAME} [{group}] → uv")
    pinned = _select_artifacts(package, target)
    if pinned.from_sdist:
        raise LockfileError(f"uv=={pinned.version}: no wheel for {target.description} in {lock.path.name}")
    best = pinned.artifacts[0]
    return PinnedWheel(name="uv", version=pinned.version, filename=best.filename, url=best.url, sha256=best.sha256)
