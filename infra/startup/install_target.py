"""A Cloud TPU VM as an install target: CPython of ``.python-version`` on glibc Linux x86_64.

:class:`InstallTarget` answers, for the VM rather than the machine running this code,
the two questions that decide which locked packages and files the VM installs: does a PEP 508
marker hold (https://peps.python.org/pep-0508/#environment-markers), and which wheel tags
(https://packaging.python.org/en/latest/specifications/platform-compatibility-tags/) can it
install, best first. :mod:`infra.startup.lockfile` uses both to pin the VM's requirements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from infra.config import vm_python
from infra.startup.uv_lock import LockfileError

#: Highest glibc of the target: Cloud TPU VM base images are Ubuntu 22.04 (glibc 2.35).
#: libtpu needs manylinux_2_31, jaxlib manylinux_2_27.
TARGET_GLIBC: tuple[int, int] = vm_python.VM_GLIBC
#: The target's ``X.Y`` (``{}``) in a marker's text, with the patch digits that follow it
#: (:meth:`InstallTarget.patch_releases`); linear in the text.
_VERSION_IN_TEXT = r"{}(?:\.([0-9]+))?"
#: Most patch releases one marker may name (:meth:`InstallTarget.patch_releases`).
MAX_MARKER_PATCHES = 64

# Legacy manylinux names (PEP 600): manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def read_python_version(project_root: Path) -> str:
    """The Python version the project pins in ``.python-version`` (e.g. ``"3.11"``;
    :func:`infra.config.vm_python.read_python_version`).

    Raises:
      LockfileError: the file is missing or holds no ``X.Y`` / ``X.Y.Z`` version.
    """
    try:
        return vm_python.read_python_version(project_root)
    except ValueError as err:
        raise LockfileError(str(err)) from None


@dataclass(frozen=True)
class InstallTarget:
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

    @property
    def python_platform(self) -> str:
        """``uv pip compile --python-platform``'s name of the target (``x86_64-manylinux_2_35``)."""
        return vm_python.python_platform(self.glibc)

    @property
    def compile_command(self) -> str:
        """The ``uv pip compile`` line that writes a hash-pinned requirements file for the target."""
        return vm_python.compile_command(self.python_version, self.glibc)

    def patch_releases(self, marker: str | None = None) -> list[int]:
        """The patch releases of an ``X.Y`` target that :meth:`evaluate` tries ``marker`` on.

        A marker's value can change with the patch release only where it names one: a comparison
        (``python_full_version == '3.11.3'``, ``< '3.11.4'``) changes at the version it names, and
        ``in`` / ``not in`` test substrings (PEP 508), so ``python_full_version in '3.11.10'`` holds
        for ``3.11.1`` and ``3.11.10``. So besides ``0`` and ``99`` each patch release the marker's
        text names after ``X.Y.`` (and each prefix of its digits) is tried, with its neighbours: every
        range of releases over which the marker could change holds one of them.

        Raises:
          LockfileError: the marker names more than :data:`MAX_MARKER_PATCHES` patch releases.
        """
        patches = {0, 99}
        found = re.finditer(_VERSION_IN_TEXT.format(re.escape(".".join(map(str, self.major_minor)))), marker or "")
        for match in found:
            digits = (match[1] or "0")[:6]  # a real patch release has a digit or two
            for end in range(1, len(digits) + 1):
                patch = int(digits[:end])
                patches |= {patch - 1, patch, patch + 1} - {-1}
            if len(patches) > MAX_MARKER_PATCHES:
                raise LockfileError(f"marker names more than {MAX_MARKER_PATCHES} Python patch releases")
        return sorted(patches)

    def marker_values(self, marker: str | None = None) -> list[dict[str, str]]:
        """The values of PEP 508's marker variables on the target, one mapping per Python version
        the target may be.

        With ``"3.11"`` the patch release is whatever ``uv python install`` picks on the VM, so one
        mapping per release of :meth:`patch_releases` is returned (``3.11.0`` and ``3.11.99`` for a
        marker that names none); a marker must agree on all of them (:meth:`evaluate`).
        """
        if self.python_version.count(".") == 2:
            full_versions = [self.python_version]
        else:
            full_versions = [f"{self.python_version}.{patch}" for patch in self.patch_releases(marker)]
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
        """Whether a PEP 508 marker holds on the target: on its full version if ``.python-version``
        names one, else on every patch release where the marker's value could change
        (:meth:`patch_releases`), which must agree.

        Raises:
          LockfileError: the marker's value depends on the Python patch release (the target's is
            not known: the message says what to write instead), or it does not parse.
        """
        if not marker:
            return True
        try:
            parsed = Marker(marker)
        except Exception as err:  # packaging.markers.InvalidMarker
            raise LockfileError(f"{context}: invalid marker {marker!r}: {err}") from None
        try:
            results = {parsed.evaluate(dict(values)) for values in self.marker_values(marker)}
        except LockfileError as err:
            raise LockfileError(f"{context}: {err}") from None
        if len(results) > 1:
            raise LockfileError(
                f"{context}: marker {marker!r} depends on the patch release of Python {self.python_version}, which "
                f".python-version does not pin (the VMs run the {self.python_version} release `uv python install "
                f"{self.python_version}` picks); write the marker on python_version, or pin a full version (e.g. "
                f"{self.python_version}.9) in .python-version"
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
