"""``multislice:workload``: what the stack's VMs run, when it is not the bundled trainer.

Without the key every VM runs the bundled trainer (``training/``, configured by
``multislice:training``). With it, every VM runs the user's **command** instead, under the same
systemd unit, restart policy, exit-code contract, log shipping and run directory
(docs/workloads.md is the contract a command can rely on)::

    multislice:workload:
      command: [python3, -m, MaxText.train, MaxText/configs/base.yml, steps=2000]
      source: ../maxtext            # a directory, relative to the stack file (or absolute)
      requirements: ../maxtext/requirements-tpu.txt   # pinned, with --hash lines
      env: {XLA_FLAGS: --xla_dump_to=/tmp/dump}
      steps: 2000

Keys (every error names its key path, e.g. ``multislice:workload.source``):

* ``command`` (required): the argument list, at least one non-empty string; run in the
  shipped ``source`` directory (``$PATH`` starts with the workload's virtualenv);
* ``steps`` (required): the steps the command trains; ``status`` shows step/steps and the
  run is complete at this step (the command exits 0: the completion marker says so);
* ``source``: a directory shipped with the release (every regular file below it except
  ``.git/`` and ``__pycache__/``; no symbolic links), at most :data:`MAX_SOURCE_BYTES`;
* ``requirements``: a requirements file in which every requirement is pinned (``name==version``)
  and carries at least one ``--hash=sha256:…`` (``uv pip compile --generate-hashes`` or
  ``pip-compile --generate-hashes`` write such files); the VM installs it with
  ``uv pip install --require-hashes``, as it installs the trainer's pins. Without it the command
  runs with the trainer's own environment (jax, orbax, optax, grain, …);
* ``env``: extra environment variables (names ``[A-Za-z_][A-Za-z0-9_]*``; values strings or
  numbers) that may not override the contract's own (:data:`RESERVED_PREFIXES`,
  :data:`RESERVED_NAMES`).

Relative paths are resolved against the directory of the stack file (``pulumi up`` reads
``stacks/Pulumi.<stack>.yaml``: against ``stacks/``), passed as the validation context
``{"base_dir": …}`` by :mod:`infra.config.loading`; without one, against the working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from training.validation import StrictModel

#: Largest source directory shipped, bytes (sum of its files). The source travels with every
#: release: it is hashed at every ``pulumi preview`` (the release id depends on it), written to
#: the bucket at every change, and fetched by every VM at every boot that finds a new release.
#: Code repositories fit (MaxText's ``src/`` is a few MB); datasets and checkpoints belong in
#: the bucket, where the command reads them through the run directory or its own paths.
MAX_SOURCE_BYTES = 64 * 1024 * 1024
#: Most files in a source directory (each is a tar entry and a line of the preview's file list).
MAX_SOURCE_FILES = 20_000
#: Directories never shipped (version control and bytecode caches).
SKIPPED_DIRS = frozenset({".git", "__pycache__"})
#: Largest requirements file read, bytes.
MAX_REQUIREMENTS_BYTES = 1024 * 1024
#: Most steps a command may declare (as ``multislice:training.steps``).
MAX_STEPS = 10**8
#: Environment names the contract sets (docs/workloads.md): ``env`` may not override them.
#: (``GCE_METADATA…`` and ``STORAGE_EMULATOR…``: where the VM's metadata server and Cloud Storage
#: are, ``infra.startup.contract``'s ``METADATA_HOST_ENV`` and ``STORAGE_ENDPOINT_ENV``.)
RESERVED_PREFIXES = ("MULTISLICE_", "MEGASCALE_", "GCE_METADATA", "STORAGE_EMULATOR")
#: The variables through which JAX finds the job, its coordinator and this process's place in it
#: (read in jax/_src/distributed.py and jax/_src/clusters/cloud_tpu_cluster.py, jax 0.10): an
#: ``env`` that set one would point the command at another coordinator or make it claim another
#: process's identity, and the job would hang or abort.
JOB_IDENTITY_NAMES = frozenset(
    {
        "JAX_COORDINATOR_ADDRESS",
        "JAX_COORDINATOR_PORT",
        "JAX_COORDINATOR_BIND_ADDRESS",
        "JAX_PARTITION_INDEX",
        "JAX_SLICE_INDEX",
        "JAX_LOCAL_DEVICE_IDS",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_PROCESS_ADDRESSES",
        "TPU_SKIP_MDS_QUERY",
    }
)
RESERVED_NAMES = frozenset({"PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED"}) | JOB_IDENTITY_NAMES
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``name[extras]==version`` (PEP 508 name, PEP 440 version without wildcards) with an optional marker.
_PINNED = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[A-Za-z0-9._,\s-]*\])?\s*==\s*"
    r"(?P<version>[A-Za-z0-9.!+_-]+)\s*(?:;(?P<marker>.*))?$"
)
_HASH = re.compile(r"^--hash[=\s]sha256:[0-9a-f]{64}$")


def _resolve(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(f"{value!r} is not a path; write a path relative to the stack file or an absolute one")
    path = Path(os.path.expanduser(str(value)))
    if not path.is_absolute():
        base = (info.context or {}).get("base_dir") if info.context else None
        path = Path(base or Path.cwd()) / path
    return Path(os.path.normpath(path.absolute()))


def source_files(root: Path) -> list[Path]:
    """The files of a source directory that ship, sorted by POSIX path relative to ``root``.

    Raises:
      ValueError: a symbolic link, or more than :data:`MAX_SOURCE_FILES` files or
        :data:`MAX_SOURCE_BYTES` bytes (the message names the limit, the size and why).
    """
    files: list[Path] = []
    total = 0
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(directory, d)))]:
            path = Path(directory) / name
            if path.is_symlink():
                raise ValueError(
                    f"{path.relative_to(root)} under {root} is a symbolic link; a source directory ships regular "
                    "files only (copy the target in, or point source at the directory it is in)"
                )
            if not path.is_file():
                continue
            files.append(path)
            total += path.stat().st_size
            if len(files) > MAX_SOURCE_FILES or total > MAX_SOURCE_BYTES:
                raise ValueError(
                    f"{root} holds more than {MAX_SOURCE_FILES:,} files or {MAX_SOURCE_BYTES // 2**20} MiB "
                    "(the limit of a source directory: it is hashed at every preview and shipped to every VM with "
                    "each release); ship the code only and keep data in the bucket"
                )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def parse_requirements(text: str) -> list[tuple[str, str, str | None, list[str]]]:
    """``(name, version, marker, hashes)`` of each requirement of a hash-pinned requirements file.

    The accepted form is what ``uv pip compile --generate-hashes`` and ``pip-compile
    --generate-hashes`` write (https://pip.pypa.io/en/stable/topics/secure-installs/#hash-checking-mode):
    one ``name==version`` per requirement (extras and a ``; marker`` allowed), each with one or more
    ``--hash=sha256:<hex>`` options, lines continued with ``\\``, ``#`` comments.

    Raises:
      ValueError: a requirement that is not pinned with ``==``, lacks a hash, or a line with
        anything else (``-e``, ``-r``, ``--index-url``, a URL): the message names the line.
    """
    requirements = []
    logical: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
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
        parts = re.split(r"\s+(?=--)", line)
        head, options = parts[0], parts[1:]
        if head.startswith("-"):
            raise ValueError(
                f"line {number}: {head.split()[0]!r}: only pinned requirements with --hash options are allowed "
                "(no -e, -r, -c or index options: the VM installs from PyPI with --require-hashes)"
            )
        match = _PINNED.match(head)
        if not match:
            raise ValueError(
                f"line {number}: {head[:80]!r} is not pinned as name==version (the VM installs exactly the pinned "
                "files: write the file with `uv pip compile --generate-hashes`)"
            )
        hashes = []
        for option in options:
            if not _HASH.match(option.strip()):
                raise ValueError(
                    f"line {number}: {option.strip()[:80]!r}: only --hash=sha256:<64 hex digits> may follow"
                )
            hashes.append(option.strip()[-64:])
        if not hashes:
            raise ValueError(
                f"line {number}: {match['name']}=={match['version']} has no --hash=sha256:… option; every "
                "requirement needs one (uv pip install --require-hashes on the VM)"
            )
        marker = match["marker"].strip() if match["marker"] else None
        requirements.append((match["name"], match["version"], marker, sorted(hashes)))
    if not requirements:
        raise ValueError("holds no requirement; leave requirements out to run with the trainer's environment")
    return requirements


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
                f"{value!r} is not a list of strings; write the argument list, e.g. [python3, train.py, --steps, '100']"
            )
        if not value:
            raise ValueError("is empty; give at least the program to run")
        for index, arg in enumerate(value):
            if not isinstance(arg, str):
                raise ValueError(f"item {index} ({arg!r}) is not a string; quote it in YAML, e.g. '{arg}'")
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
        if not path.exists():
            raise ValueError(f"{path} does not exist (a path relative to the stack file, or absolute)")
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
            raise ValueError(f"{value!r} is not a mapping of NAME: value")
        out = {}
        for name, item in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if name in JOB_IDENTITY_NAMES or name.startswith("MEGASCALE_"):
                raise ValueError(
                    f"{name} is set by the workload contract (docs/workloads.md) and cannot be overridden: it tells "
                    "JAX where the run's coordinator is and which slice and process this is, which the VM's metadata "
                    "gives every process alike; remove it from env"
                )
            if name.startswith(RESERVED_PREFIXES) or name in RESERVED_NAMES:
                raise ValueError(
                    f"{name} is set by the workload contract (docs/workloads.md) and cannot be overridden; "
                    f"names starting with {', '.join(RESERVED_PREFIXES)} and {', '.join(sorted(RESERVED_NAMES))} "
                    "are reserved"
                )
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise ValueError(f"{name}: {item!r} is not a string or a number (quote it)")
            if "\0" in str(item):
                raise ValueError(f"{name}: the value holds a NUL character")
            out[name] = str(item)
        return dict(sorted(out.items()))

    def description(self) -> dict[str, Any]:
        """What a preview shows of the workload (no local paths: they differ between checkouts)."""
        return {"command": list(self.command), "env": dict(self.env), "steps": self.steps}
