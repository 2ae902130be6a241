"""A stack's own command in the release: its spec, source and requirements (``multislice:workload``).

:func:`workload_files` adds to the release (:mod:`infra.startup.script`):

* ``workload.json``: ``{"command", "env", "steps"}`` (read on the VM by ``training.workload``);
* the source directory's files under ``workload/`` (the command's working directory), when its
  tar is at most :data:`INLINE_SOURCE_BYTES`; a larger source goes through the bucket instead:
  the release then holds ``workload-source.json`` (``{"object", "sha256", "bytes"}``) and
  ``boot.sh`` fetches that object from the stack's bucket, checks its sha256 and unpacks it
  into ``workload/`` (``pulumi up`` writes it: :mod:`infra.components.release`; the local
  emulation puts it in its emulated bucket). Either way the source's bytes decide the
  release id, so a changed source is a new release (nodes updated in place and reset);
* ``workload-requirements.txt``: the user's hash-pinned requirements, installed on the VM into
  a virtualenv of their own with ``uv pip install --require-hashes`` (``boot.sh``), as the
  trainer's pins are.

:func:`check_requirements` is the platform check done at render time (``pulumi preview``): each
requirement's PEP 508 marker is evaluated for the VM (:class:`~infra.startup.install_target.
InstallTarget`: CPython of ``.python-version`` on manylinux_2_35 x86_64; a marker whose value
depends on a Python patch release ``.python-version`` does not pin is refused); a ``uv pip compile``
header that names another Python version or platform is refused; and a requirement whose
``name==version`` this project's ``uv.lock`` also records must hash at least one file the VM
can install (a wheel whose tags it accepts, or the sdist). Requirements the lock does not know,
and URL requirements (``name @ https://…``, :func:`infra.config.workload.parse_requirements`:
the lock records no archive of theirs), are checked on the VM by uv (a hash-pinned file names
no files: which wheel exists for the VM is known only to the index; an archive's hash is checked
when uv downloads it).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from infra.config.workload import MAX_REQUIREMENTS_BYTES, WorkloadSettings, parse_requirements, source_files
from infra.readers.files import read_bounded
from infra.startup.bundle import build_archive
from infra.startup.install_target import InstallTarget
from infra.startup.uv_lock import Lock, LockfileError
from infra.vm_contract import workload_source_object

#: A source whose tar is at most this many bytes travels inside the startup script (it stays well
#: inside the size the script aims for, infra.startup.script.TARGET_SIZE_BYTES, after xz); a
#: larger one through the bucket.
INLINE_SOURCE_BYTES = 32 * 1024
#: The release's files for a command (the names ``boot.sh``, ``trainer.sh`` and
#: ``training.workload`` read).
SPEC_FILE = "workload.json"
SOURCE_DIR = "workload"
SOURCE_REF_FILE = "workload-source.json"
REQUIREMENTS_FILE = "workload-requirements.txt"


class WorkloadError(ValueError):
    """The workload cannot run on the VMs (its requirements); the message names the key."""


@dataclass(frozen=True)
class WorkloadRelease:
    """What a command adds to a release.

    Attributes:
      files: release path → content.
      source_tar: the source as a reproducible tar (empty bytes without ``source``).
      source_object: the bucket object it travels in when not inline, else None.
      source_sha256: hex sha256 of ``source_tar`` ("" without ``source``).
      requirements_sha256: hex sha256 of ``workload-requirements.txt`` ("" without it).
    """

    files: dict[str, bytes]
    source_tar: bytes
    source_object: str | None
    source_sha256: str
    requirements_sha256: str


def source_archive(root: Path) -> tuple[dict[str, bytes], bytes]:
    """The source directory's files (``workload/<relative path>`` → bytes) and their
    reproducible tar (paths relative to the directory; :func:`infra.startup.bundle.build_archive`)."""
    files = {path.relative_to(root).as_posix(): path.read_bytes() for path in source_files(root)}
    return {f"{SOURCE_DIR}/{name}": data for name, data in files.items()}, build_archive(files)


def _compiled_for(text: str, target: InstallTarget) -> dict[str, str]:
    """``--python-version`` / ``--python-platform`` of a ``uv pip compile`` header line, if any.

    Raises:
      WorkloadError: the header line does not split as a shell command (an unbalanced quote).
    """
    for line in text.splitlines()[:5]:
        if line.startswith("#") and "uv pip compile" in line:
            try:
                words = shlex.split(line.lstrip("# "))
            except ValueError as err:  # shlex: "No closing quotation", "No escaped character"
                raise WorkloadError(
                    f"multislice:workload.requirements: its uv pip compile header {line.strip()[:120]!r} does not "
                    f"parse ({err}); compile the file again for the VMs: `{target.compile_command}`"
                ) from None
            found = {}
            for i, word in enumerate(words):
                for option in ("--python-version", "--python-platform"):
                    if word == option and i + 1 < len(words):
                        found[option] = words[i + 1]
                    elif word.startswith(option + "="):
                        found[option] = word.split("=", 1)[1]
            return found
    return {}


def check_requirements(text: str, target: InstallTarget, lock: Lock | None) -> None:
    """The render-time platform check of a hash-pinned requirements file (module docstring).

    Raises:
      WorkloadError: a marker that cannot be decided or does not parse, a header compiled for
        another Python or platform, or a known package whose hashed files none installs on the VM.
    """
    key = "multislice:workload.requirements"
    compiled = _compiled_for(text, target)
    version = compiled.get("--python-version")
    if version is not None and not (
        version == target.python_version or version.startswith(target.python_version + ".")
    ):
        raise WorkloadError(
            f"{key}: compiled for Python {version} (its uv pip compile header), but the VMs run {target.description}; "
            f"compile it for them: `{target.compile_command}`"
        )
    platform = compiled.get("--python-platform")
    if platform is not None and ("linux" not in platform or "x86_64" not in platform):
        raise WorkloadError(
            f"{key}: compiled for platform {platform} (its uv pip compile header), but the VMs run "
            f"{target.description}; compile it for them: `{target.compile_command}`"
        )
    try:
        requirements = parse_requirements(text)
    except ValueError as err:
        raise WorkloadError(f"{key}: {err}") from None
    for requirement in requirements:
        name, version, hashes = requirement.name, requirement.version, requirement.hashes
        try:
            if not target.evaluate(requirement.marker, context=f"line {requirement.line}: {requirement}"):
                continue
        except LockfileError as err:
            raise WorkloadError(f"{key}: {err}") from None
        if lock is None or version is None:  # a URL requirement: uv checks its archive's hash on the VM
            continue
        known = [p for p in lock.candidates(name) if p.get("version") == version]
        if not known:
            continue
        installable = {
            entry["hash"].split(":", 1)[1]
            for package in known
            for entry in package.get("wheels", [])
            if target.wheel_rank(str(entry.get("url", "")).rsplit("/", 1)[-1]) is not None
        }
        installable |= {p["sdist"]["hash"].split(":", 1)[1] for p in known if "sdist" in p}
        recorded = {entry["hash"].split(":", 1)[1] for p in known for entry in p.get("wheels", [])}
        if set(hashes) <= recorded and not set(hashes) & installable:
            raise WorkloadError(
                f"{key}: {canonicalize_name(name)}=={version}: none of its hashed files installs on "
                f"{target.description} "
                "(uv.lock records them as wheels for other platforms); compile the file for the VMs: "
                f"`{target.compile_command}`"
            )


def workload_files(stack: str, workload: WorkloadSettings, target: InstallTarget, lock: Lock | None) -> WorkloadRelease:
    """The release files of ``workload`` (module docstring).

    Raises:
      WorkloadError: as :func:`check_requirements`.
      ValueError: the source directory changed since validation and breaks its limits.
      infra.readers.files.UnreadableFile: the requirements file is no longer a regular file of at most
        ``MAX_REQUIREMENTS_BYTES`` (it changed since validation).
    """
    spec = {"command": list(workload.command), "env": dict(workload.env), "steps": workload.steps}
    files = {SPEC_FILE: (json.dumps(spec, sort_keys=True, indent=1) + "\n").encode()}
    tar, source_object, source_sha256 = b"", None, ""
    if workload.source is not None:
        source_files_, tar = source_archive(workload.source)
        source_sha256 = hashlib.sha256(tar).hexdigest()
        if len(tar) <= INLINE_SOURCE_BYTES:
            files.update(source_files_)
        else:
            source_object = workload_source_object(stack, source_sha256)
            reference = {"bytes": len(tar), "object": source_object, "sha256": source_sha256}
            files[SOURCE_REF_FILE] = (json.dumps(reference, sort_keys=True) + "\n").encode()
    requirements_sha256 = ""
    if workload.requirements is not None:
        # Bounded as validated (a file swapped since is refused), newlines as read_text's universal newlines.
        data = read_bounded(workload.requirements, MAX_REQUIREMENTS_BYTES).decode("utf-8")
        text = data.replace("\r\n", "\n").replace("\r", "\n")
        check_requirements(text, target, lock)
        files[REQUIREMENTS_FILE] = text.encode()
        requirements_sha256 = hashlib.sha256(text.encode()).hexdigest()
    return WorkloadRelease(files, tar, source_object, source_sha256, requirements_sha256)
