"""``multislice:workload``: what the stack's VMs run, when it is not the bundled trainer.

Without the key every VM runs the bundled trainer (``training/``, configured by
``multislice:training``). With it, every VM runs the user's **command** instead, under the same
systemd unit, restart policy, exit-code contract, log shipping and run directory
(docs/workloads.md is the contract a command can rely on)::

    multislice:workload:
      command: [python3, -m, maxtext.trainers.pre_train.train, maxtext/configs/base.yml, steps=2000]
      source: ../maxtext/src        # a directory, relative to the stack file (or absolute)
      requirements: ../maxtext/requirements-vm.txt    # pinned, with --hash lines
      env: {XLA_FLAGS: --xla_dump_to=/tmp/dump}
      steps: 2000

Keys (every error names its key path, e.g. ``multislice:workload.source``):

* ``command`` (required): the argument list, at least one non-empty string; run in the
  shipped ``source`` directory (``$PATH`` starts with the workload's virtualenv);
* ``steps`` (required): the steps the command trains; ``status`` shows step/steps and the
  run is complete at this step (the command exits 0: the completion marker says so);
* ``source``: a directory shipped with the release (every regular file below it except
  ``.git/`` and ``__pycache__/``; no symbolic links), at most :data:`MAX_SOURCE_BYTES` in
  :data:`MAX_SOURCE_FILES` files, no deeper than :data:`MAX_SOURCE_DEPTH` folders;
* ``requirements``: a requirements file in which every requirement is pinned and carries at
  least one ``--hash=sha256:…`` (``uv pip compile --generate-hashes`` or ``pip-compile
  --generate-hashes`` write such files); the VM installs it with ``uv pip install
  --require-hashes``, as it installs the trainer's pins. Without it the command runs with the
  trainer's own environment (jax, orbax, optax, grain, …). Pinned is ``name==version`` (a file of
  the index) or ``name @ https://…`` (PEP 508's direct reference to an archive, e.g. GitHub's
  ``…/archive/<commit>.zip``, which MaxText's requirements use). For a URL the hash is the pin: it
  names the archive's bytes, so the VM installs those bytes or nothing, whatever the URL serves
  later; and hash-checking mode needs a hash for every requirement, so a URL without one could
  not install anyway. Refused, each with what to write instead: a VCS checkout (``git+https://…``:
  no archive to hash; uv refuses it in that mode), a URL other than https (the hash would catch
  changed bytes; https also keeps the fetch authenticated and private, and every archive host
  serves it), a URL without a hash,
  a local path or ``file:`` URL (not on the VMs), and a GitHub archive of a branch
  (``…/archive/refs/heads/…``, or any ``…/archive/<name>.zip`` whose name is not a 40-hex commit:
  GitHub resolves a name when the archive is downloaded, and a branch's bytes change with every
  push, so its hash soon fails; a tag is written ``…/archive/refs/tags/<tag>.zip``);
* ``env``: extra environment variables (names ``[A-Za-z_][A-Za-z0-9_]*``; values strings or
  numbers) except those of :data:`infra.config.workload_env.REFUSED_ENV` (the contract's own, JAX's
  job identity, those that move Python's imports or make JAX detect another launcher's cluster).

Relative paths are resolved against the directory of the stack file (``pulumi up`` reads
``stacks/Pulumi.<stack>.yaml``: against ``stacks/``), passed as the validation context
``{"base_dir": …}`` by :mod:`infra.config.loading`; without one, against the working directory.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from infra.config.requirement_urls import VCS_PREFIXES, local_path_problem, url_problem
from infra.config.vm_python import compile_command
from infra.config.workload_env import refused_env
from training.redaction import redacted
from training.validation import StrictModel, invalid

#: Largest source directory shipped, bytes (sum of its files). The source travels with every
#: release: it is hashed at every ``pulumi preview`` (the release id depends on it), written to
#: the bucket at every change, and fetched by every VM at every boot that finds a new release.
#: Code repositories fit (MaxText's ``src/`` is a few MB); datasets and checkpoints belong in
#: the bucket, where the command reads them through the run directory or its own paths.
MAX_SOURCE_BYTES = 64 * 1024 * 1024
#: Most files in a source directory (each is a tar entry and a line of the preview's file list).
MAX_SOURCE_FILES = 20_000
#: Most folders between a source directory and its deepest file (code is a few levels deep).
MAX_SOURCE_DEPTH = 64
#: Directories never shipped (version control and bytecode caches).
SKIPPED_DIRS = frozenset({".git", "__pycache__"})
#: Largest requirements file read, bytes.
MAX_REQUIREMENTS_BYTES = 1024 * 1024
#: Most steps a command may declare (as ``multislice:training.steps``).
MAX_STEPS = 10**8
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HASH = re.compile(r"^--hash[=\s]sha256:[0-9a-f]{64}$")
#: A URL (``https://…``, ``file:…``) at the head of a requirement line: a requirement without its name.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
#: Archive names pip installs from a path (``./dist/pkg-1.0.tar.gz``, ``pkg.whl``).
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar")
#: A ``#`` comment to the end of a requirements line. Every pattern here meets user text and runs in time
#: linear in it (tests/config/test_hostile_input.py tries each on long runs of every kind of character).
_COMMENT = re.compile(r"(^|\s)#.*$")
#: The whitespace before an option (``--hash…``): a requirement line splits there. Without the lookbehind,
#: ``\s+(?=--)`` retried a whitespace run not followed by ``--`` from each of its characters (quadratic:
#: minutes for a run of 200,000 spaces); with it a match starts only at a run's first character.
_OPTION_BREAK = re.compile(r"(?<!\s)\s+(?=--)")


@dataclass(frozen=True)
class PinnedRequirement:
    """One requirement of a hash-pinned requirements file (:func:`parse_requirements`).

    Attributes:
      name: the project name as written.
      version: the pinned version of ``name==version``; None for a URL requirement.
      url: the https URL of ``name @ URL``; None for ``name==version``.
      marker: the PEP 508 marker as written (after ``;``), or None.
      hashes: the sha256 hex digests of its ``--hash`` options, sorted.
      line: the number of the line it starts on (0: not read from a file).
    """

    name: str
    version: str | None
    url: str | None
    marker: str | None
    hashes: tuple[str, ...]
    line: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}" if self.url is None else f"{self.name} @ {self.url}"


def _looks_like_path(head: str) -> bool:
    return head.startswith((".", "~")) or "/" in head or "\\" in head or head.lower().endswith(_ARCHIVE_SUFFIXES)


def _existing(path: Path, kind: str) -> None:
    """Refuse a path that leads to no ``kind`` ("directory", "file"), saying why (a link loop, a dangling link)."""
    try:
        path.stat()
    except OSError as err:
        shown = redacted(str(path))  # a path built from a value: no user:password@ of a URI written as a path
        if err.errno == errno.ELOOP:
            raise ValueError(
                f"{shown} is a symbolic link loop (it, or a folder on its way, is a link that leads back to itself), "
                f"so it leads to no {kind}: write the path of the real {kind} (a source directory ships regular files "
                "only: links in it are refused)"
            ) from None
        if path.is_symlink():
            target = redacted(os.readlink(path))
            raise ValueError(f"{shown} is a symbolic link to {target}, which does not exist") from None
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ValueError(f"{shown} does not exist (a path relative to the stack file, or absolute)") from None
        raise ValueError(f"{shown} cannot be read ({err.strerror or 'unreadable'})") from None


def _resolve(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(
            f"{redacted(repr(value))[:80]} is not a path; write a path relative to the stack file or an absolute one"
        )
    return resolve_path(str(value), (info.context or {}).get("base_dir") if info.context else None)


def resolve_path(value: str, base_dir: Path | None) -> Path:
    """A workload path as the config reads it: ``~`` expanded, relative to ``base_dir`` (the stack
    file's folder; None: the working directory), normalized, absolute."""
    path = Path(os.path.expanduser(value))
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    return Path(os.path.normpath(path.absolute()))


def source_files(root: Path) -> list[Path]:
    """The files of a source directory that ship, sorted by POSIX path relative to ``root``; an
    iterative walk (a stack of folders, no recursion) at most :data:`MAX_SOURCE_DEPTH` folders deep.

    Raises:
      ValueError: a symbolic link, more than :data:`MAX_SOURCE_FILES` files or :data:`MAX_SOURCE_BYTES`
        bytes, folders nested deeper than :data:`MAX_SOURCE_DEPTH`, or a folder that cannot be read
        (the message names the limit or the folder, and why).
    """
    files: list[Path] = []
    total = 0
    pending = [(root, 0)]
    while pending:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as err:  # permissions, or a path longer than the OS allows
            raise ValueError(f"{directory} cannot be read ({err.strerror or err})") from None
        for entry in entries:
            path = Path(entry.path)
            try:  # is_dir() follows a link to a folder, as os.walk does: such a link is refused below
                is_dir = entry.is_dir()
            except OSError:  # a link that loops: refused below as a link
                is_dir = False
            if is_dir and entry.name in SKIPPED_DIRS:
                continue
            if entry.is_symlink():
                raise ValueError(
                    f"{path.relative_to(root)} under {root} is a symbolic link; a source directory ships regular "
                    "files only (copy the target in, or point source at the directory it is in)"
                )
            if is_dir and depth == MAX_SOURCE_DEPTH:
                raise ValueError(
                    f"{root} is nested deeper than {MAX_SOURCE_DEPTH} folders ({path.relative_to(root).as_posix()[:60]}"
                    "…); a source directory ships code, a few folders deep: point source at the code's own folder"
                )
            if is_dir:
                pending.append((path, depth + 1))
            elif entry.is_file():
                files.append(path)
                total += entry.stat().st_size
                if len(files) > MAX_SOURCE_FILES or total > MAX_SOURCE_BYTES:
                    raise ValueError(
                        f"{root} holds more than {MAX_SOURCE_FILES:,} files or {MAX_SOURCE_BYTES // 2**20} MiB "
                        "(the limit of a source directory: it is hashed at every preview and shipped to every VM "
                        "with each release); ship the code only and keep data in the bucket"
                    )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def parse_requirements(text: str) -> list[PinnedRequirement]:
    """Each requirement of a hash-pinned requirements file, in file order.

    The accepted form is what ``uv pip compile --generate-hashes`` and ``pip-compile
    --generate-hashes`` write (https://pip.pypa.io/en/stable/topics/secure-installs/#hash-checking-mode):
    one requirement per logical line, pinned either as ``name==version`` or as a direct reference
    to an https archive, ``name @ https://…`` (PEP 508; extras and a ``; marker`` allowed), each
    with one or more ``--hash=sha256:<hex>`` options; lines continued with ``\\``, ``#`` comments.
    The hash is what pins a URL requirement: it names the archive's bytes, whatever the URL
    serves later (the module docstring has the rule and its reasons). The parse takes time linear
    in the text's length (the file is at most :data:`MAX_REQUIREMENTS_BYTES`).

    Raises:
      ValueError: a requirement that is not pinned with ``==``, lacks a hash, is a VCS checkout,
        a local path or a URL other than https (or a GitHub branch archive), or a line with
        anything else (``-e``, ``-r``, ``--index-url``): the message names the line and what to do.
    """
    requirements = []
    logical: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).rstrip()
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        if buffer.strip():
            logical.append((start, buffer.strip()))
        buffer = ""
    if buffer.strip():
        logical.append((start, buffer.strip()))
    for number, line in logical:
        parts = _OPTION_BREAK.split(line)
        head, options = parts[0], parts[1:]
        if head.startswith("-"):
            raise ValueError(
                f"line {number}: {redacted(head.split()[0])[:80]!r}: only pinned requirements with --hash options are "
                "allowed "
                "(no -e, -r, -c or index options: the VM installs from PyPI with --require-hashes)"
            )
        hashes = []
        for option in options:
            if not _HASH.fullmatch(option.strip()):
                raise ValueError(
                    f"line {number}: {redacted(option.strip())[:80]!r}: only --hash=sha256:<64 hex digits> may follow"
                )
            hashes.append(option.strip()[-64:])
        requirements.append(_requirement(number, head, hashes))
    if not requirements:
        raise ValueError("holds no requirement; leave requirements out to run with the trainer's environment")
    return requirements


def _requirement(number: int, head: str, hashes: list[str]) -> PinnedRequirement:
    """The requirement ``head`` of line ``number`` with its ``hashes`` (:func:`parse_requirements`)."""
    # Here, not at the top: packaging's parser is 20 ms of imports that a stack without a workload,
    # read by every command, never uses.
    from packaging.requirements import InvalidRequirement, Requirement

    not_pinned = (
        f"line {number}: {redacted(head)[:80]!r} is not pinned as name==version or name @ https://… (the VM installs "
        f"exactly the pinned files: write the file for the VMs with `{compile_command()}`)"
    )
    if head.lower().startswith(VCS_PREFIXES) or _SCHEME.match(head):  # a URL without its name
        raise ValueError(f"line {number}: {url_problem(None, head.split(';', 1)[0].strip(), hashes)}")
    try:
        requirement = Requirement(head)
    except InvalidRequirement as err:
        if _looks_like_path(head):
            raise ValueError(f"line {number}: {local_path_problem(head)}") from None
        if ";" in head:
            try:
                Requirement(head.split(";", 1)[0])
            except InvalidRequirement:
                pass
            else:
                reason = str(err).splitlines()[0]
                raise ValueError(
                    f"line {number}: {redacted(head)[:80]!r}: its marker does not parse ({redacted(reason)})"
                ) from None
        raise ValueError(not_pinned) from None
    if requirement.url is not None:
        problem = url_problem(requirement.name, requirement.url, hashes)
        if problem:
            raise ValueError(f"line {number}: {problem}")
        after = head[head.index(requirement.url) + len(requirement.url) :].strip()
        marker = after.removeprefix(";").strip() if requirement.marker is not None else None
        return PinnedRequirement(requirement.name, None, requirement.url, marker, tuple(sorted(hashes)), number)
    specifiers = list(requirement.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        if not specifiers and _looks_like_path(head):
            raise ValueError(f"line {number}: {local_path_problem(head)}")
        raise ValueError(not_pinned)
    version = specifiers[0].version
    if not hashes:
        raise ValueError(
            f"line {number}: {requirement.name}=={version} has no --hash=sha256:… option; every "
            "requirement needs one (uv pip install --require-hashes on the VM)"
        )
    marker = head.split(";", 1)[1].strip() if requirement.marker is not None else None
    return PinnedRequirement(requirement.name, version, None, marker, tuple(sorted(hashes)), number)


class WorkloadSettings(StrictModel):
    """``multislice:workload``: the user's command instead of the bundled trainer (module docstring)."""

    model_config = StrictModel.model_config | {"populate_by_name": True}

    command: tuple[str, ...] = Field(description="The argument list every VM runs; the first is the program.")
    steps: int = Field(ge=1, le=MAX_STEPS, description="Steps the command trains: status's total, the completion step.")
    source: Path | None = Field(default=None, description="Directory shipped with the release; the command runs in it.")
    requirements: Path | None = Field(default=None, description="Hash-pinned requirements file for the command.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables of the command.")

    @field_validator("command", mode="before")
    @classmethod
    def _argument_list(cls, value: Any) -> Any:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError(
                f"{redacted(repr(value))} is not a list of strings; write the argument list, e.g. "
                "[python3, train.py, --steps, '100']"
            )
        if not value:
            raise ValueError("is empty; give at least the program to run")
        for index, arg in enumerate(value):
            if not isinstance(arg, str):
                shown = redacted(repr(arg))[:80]
                raise ValueError(f"item {index} ({shown}) is not a string; quote it in YAML, e.g. '{shown}'")
            if "\0" in arg:
                raise ValueError(f"item {index} holds a NUL character")
        if not value[0].strip():
            raise ValueError("item 0 (the program) is empty")
        return tuple(value)

    @field_validator("source", mode="before")
    @classmethod
    def _source_directory(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        path = _resolve(value, info)
        _existing(path, "directory")
        if not path.is_dir():
            raise ValueError(f"{path} is not a directory")
        source_files(path)  # the size limit and symbolic links
        return path

    @field_validator("requirements", mode="before")
    @classmethod
    def _pinned_requirements(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        path = _resolve(value, info)
        _existing(path, "file")
        if not path.is_file():
            raise ValueError(f"{path} is not a file (a path relative to the stack file, or absolute)")
        if path.stat().st_size > MAX_REQUIREMENTS_BYTES:
            raise ValueError(f"{path} is over {MAX_REQUIREMENTS_BYTES // 1024} KiB; a requirements file is far smaller")
        try:
            parse_requirements(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text") from None
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
        return path

    @field_validator("env", mode="before")
    @classmethod
    def _environment(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"is a {type(value).__name__}, not a mapping of NAME: value")  # values unshown: secrets
        out = {}
        for name, item in value.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                shown = redacted(repr(name.split("=", 1)[0] + "=…" if isinstance(name, str) and "=" in name else name))
                raise ValueError(f"{shown[:80]} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            refusal = refused_env(name)
            if refusal is not None:  # multislice:workload.env.<NAME>: why (infra.config.workload_env)
                raise invalid(name, refusal)
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                # the value is not shown: under a name such as DB_PASSWORD any value is a secret
                raise ValueError(f"{name}: a {type(item).__name__} is not a string or a number (quote it)")
            if "\0" in str(item):
                raise ValueError(f"{name}: the value holds a NUL character")
            out[name] = str(item)
        return dict(sorted(out.items()))

    def description(self) -> dict[str, Any]:
        """What a preview shows of the workload (no local paths: they differ between checkouts)."""
        return {"command": list(self.command), "env": dict(self.env), "steps": self.steps}
