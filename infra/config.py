"""StackConfig: the one parser of a stack's configuration.

A stack is ``stacks/Pulumi.<stack>.yaml`` (``stackConfigDir: stacks`` in Pulumi.yaml). Its
``config:`` map holds ``gcp:project``, ``gcp:zone`` and the ``multislice:*`` keys below.
Two paths read it and must give equal models (tests/test_config.py checks this):

* inside ``pulumi up``/``preview``: :func:`from_pulumi_config` reads the engine's config map
  (scalars arrive as strings, objects as JSON text);
* everywhere else (local emulation, ``multislice plan``, rendering): :func:`load_stack`
  reads the YAML file directly.

Validation happens before any resource exists. A :class:`StackConfigError` lists every
problem as ``<key path>: <what is wrong; what is allowed>``.

Rules and their sources:

* accelerator type is in the catalog (``infra.accelerators``);
* slices > 1 only where the generation supports Multislice (v4 and later), and
  1 ≤ slices ≤ 256 (SEED-NOTES.md, "Concepts");
* ici.data × ici.fsdp × ici.tensor = chips per slice and dcn.data × dcn.fsdp × dcn.tensor =
  slices, dcn.tensor = 1 (SEED-NOTES.md, "Parallelism rules");
* the global batch divides by the data-parallel size (``training.config``);
* ``reservationName`` only with ``capacity: reserved``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import Field, field_validator, model_validator

from infra import accelerators
from training.config import StrictModel, TrainConfig, format_errors, invalid

#: Keys of other namespaces that this program reads. All other ``gcp:*`` keys (credentials,
#: impersonation, …) belong to the gcp provider and are left alone.
GCP_KEYS = ("gcp:project", "gcp:zone")
NAMESPACE = "multislice"

CAPACITY_TYPES = ("spot", "on-demand", "reserved", "best-effort")

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_STACK = re.compile(r"^[A-Za-z0-9_.-]+$")


class StackConfigError(ValueError):
    """A stack file that cannot be used; ``lines`` holds one ``key path: problem`` each."""

    def __init__(self, summary: str, lines: list[str] | None = None):
        self.summary = summary
        self.lines = list(lines or [])
        text = summary if not self.lines else summary + "\n" + "\n".join(f"  {line}" for line in self.lines)
        super().__init__(text)


class StackConfig(StrictModel):
    """A validated stack. Field aliases are the stack-file keys.

    ``stack`` is the stack name (from the file name or ``pulumi.get_stack()``), not a key.
    """

    model_config = StrictModel.model_config | {"populate_by_name": True}

    stack: str = Field(pattern=_STACK.pattern)
    project: str = Field(alias="gcp:project", description="GCP project id.")
    zone: str = Field(alias="gcp:zone", description="Zone of the TPU slices, e.g. us-central2-b.")
    accelerator_type: str = Field(alias="multislice:acceleratorType", description="e.g. v4-8, v5p-16, v6e-256.")
    slices: int = Field(1, ge=1, le=accelerators.MAX_SLICES, alias="multislice:slices")
    runtime_version: str | None = Field(
        None, min_length=1, alias="multislice:runtimeVersion", description="TPU software version; catalog default."
    )
    capacity: Literal["spot", "on-demand", "reserved", "best-effort"] = Field(
        "on-demand", alias="multislice:capacity"
    )
    reservation_name: str | None = Field(None, min_length=1, alias="multislice:reservationName")
    run_name: str | None = Field(
        None, pattern=_STACK.pattern, alias="multislice:runName", description="Run directory name; default: stack."
    )
    training: TrainConfig = Field(TrainConfig(), alias="multislice:training")

    @field_validator("project")
    @classmethod
    def _project_id(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(
                f"{value!r} is not a GCP project id (6–30 characters: lowercase letters, digits, hyphens; "
                "starts with a letter)"
            )
        return value

    @field_validator("zone")
    @classmethod
    def _zone_format(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"{value!r} is not a zone name like 'us-central2-b' (<region>-<letter>)")
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        accelerators.parse_accelerator_type(value)  # UnknownAcceleratorType is a ValueError
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        acc = accelerators.parse_accelerator_type(self.accelerator_type)
        gen = acc.generation
        if self.slices > 1 and not gen.supports_multislice:
            raise invalid(
                "multislice:slices",
                f"Multislice needs TPU v4 or later; {self.accelerator_type} allows only 1 slice",
            )
        if self.reservation_name is not None and self.capacity != "reserved":
            raise invalid(
                "multislice:reservationName",
                f"is only used with multislice:capacity 'reserved' (capacity is {self.capacity!r})",
            )
        par = self.training.parallelism
        if par.ici.product != acc.chips:
            raise invalid(
                "multislice:training.parallelism.ici",
                f"data×fsdp×tensor = {par.ici.data}×{par.ici.fsdp}×{par.ici.tensor} = {par.ici.product} "
                f"must equal the chips per slice of {self.accelerator_type}: {acc.chips}",
            )
        if par.dcn.product != self.slices:
            raise invalid(
                "multislice:training.parallelism.dcn",
                f"data×fsdp×tensor = {par.dcn.data}×{par.dcn.fsdp}×{par.dcn.tensor} = {par.dcn.product} "
                f"must equal multislice:slices: {self.slices}",
            )
        return self

    # Derived values -------------------------------------------------------------------------

    @property
    def accelerator(self) -> accelerators.AcceleratorType:
        return accelerators.parse_accelerator_type(self.accelerator_type)

    @property
    def region(self) -> str:
        """The zone's region: ``us-central2-b`` → ``us-central2``."""
        return self.zone.rsplit("-", 1)[0]

    @property
    def effective_runtime_version(self) -> str:
        return self.runtime_version or self.accelerator.generation.default_runtime_version

    @property
    def effective_run_name(self) -> str:
        return self.run_name or self.stack

    @property
    def workers_per_slice(self) -> int:
        return self.accelerator.hosts

    @property
    def total_workers(self) -> int:
        return self.slices * self.accelerator.hosts


# Reading -------------------------------------------------------------------------------------


def _allowed_keys() -> list[str]:
    return [f.alias for name, f in StackConfig.model_fields.items() if f.alias]


def _structured_keys() -> set[str]:
    """Keys whose value is an object (Pulumi hands these to programs as JSON text)."""
    return {"multislice:training"}


def validate_stack(stack: str, config: dict[str, Any], source: str) -> StackConfig:
    """Build a StackConfig from a stack's ``config:`` map.

    Args:
      stack: the stack name.
      config: keys as written in the stack file (``"multislice:slices"``); values may be
        typed (YAML) or strings/JSON text (the Pulumi engine).
      source: where the map came from, for the error summary.

    Raises:
      StackConfigError: one line per problem, each naming the key.
    """
    values: dict[str, Any] = {}
    unknown: list[str] = []
    allowed = _allowed_keys()
    for key, value in config.items():
        namespace = key.split(":", 1)[0] if ":" in key else NAMESPACE
        full_key = key if ":" in key else f"{NAMESPACE}:{key}"
        if namespace == "gcp" and full_key not in GCP_KEYS:
            continue  # provider configuration, not ours
        if namespace not in (NAMESPACE, "gcp"):
            continue
        if full_key not in allowed:
            unknown.append(full_key)
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            raise StackConfigError(
                f"stack {stack!r} ({source}) is invalid:",
                [f"{full_key}: secret values are not supported for this key; store it in plain text"],
            )
        if full_key in _structured_keys() and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise StackConfigError(
                    f"stack {stack!r} ({source}) is invalid:", [f"{full_key}: not a JSON object ({err})"]
                ) from None
        values[full_key] = value
    lines = [
        f"{key}: unknown key; allowed keys: {', '.join(k for k in allowed if k.startswith(NAMESPACE))}"
        for key in unknown
    ]
    for key in ("gcp:project", "gcp:zone", "multislice:acceleratorType"):
        if key not in values:
            lines.append(f"{key}: required key is missing")
    if lines:
        raise StackConfigError(f"stack {stack!r} ({source}) is invalid:", lines)
    try:
        return StackConfig.model_validate({"stack": stack, **values})
    except pydantic.ValidationError as err:
        raise StackConfigError(f"stack {stack!r} ({source}) is invalid:", format_errors(err)) from None


def default_stacks_dir() -> Path:
    """``stacks/`` of the project: the nearest Pulumi.yaml above the working directory that
    names this project, else the checkout this package was installed from."""
    env = os.environ.get("MULTISLICE_STACKS_DIR")
    if env:
        return Path(env)
    for parent in [Path.cwd(), *Path.cwd().parents]:
        project = parent / "Pulumi.yaml"
        if project.is_file():
            try:
                data = yaml.safe_load(project.read_text()) or {}
            except yaml.YAMLError:
                continue
            if data.get("name") == "multislice":
                return parent / str(data.get("stackConfigDir", "."))
    return Path(__file__).resolve().parents[1] / "stacks"


def stack_file(stack: str, stacks_dir: Path | None = None) -> Path:
    return (stacks_dir or default_stacks_dir()) / f"Pulumi.{stack}.yaml"


def available_stacks(stacks_dir: Path | None = None) -> list[str]:
    directory = stacks_dir or default_stacks_dir()
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load_stack_file(path: Path, stack: str | None = None) -> StackConfig:
    """Read and validate a stack file anywhere on disk.

    Args:
      path: a ``Pulumi.<stack>.yaml`` file.
      stack: stack name; by default taken from the file name.

    Raises:
      StackConfigError: missing or malformed file, or invalid keys.
    """
    path = Path(path)
    if stack is None:
        name = path.name
        stack = name[len("Pulumi.") : -len(".yaml")] if name.startswith("Pulumi.") and name.endswith(".yaml") else path.stem
    if not path.is_file():
        raise StackConfigError(f"stack file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise StackConfigError(f"stack file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
        raise StackConfigError(f"stack file {path} must be a mapping with a 'config:' mapping inside")
    return validate_stack(stack, data.get("config") or {}, str(path))


def load_stack(stack: str, stacks_dir: Path | None = None) -> StackConfig:
    """Read and validate ``stacks/Pulumi.<stack>.yaml``.

    Raises:
      StackConfigError: the stack does not exist (the message lists those that do), or is invalid.
    """
    path = stack_file(stack, stacks_dir)
    if not path.is_file():
        known = available_stacks(stacks_dir)
        raise StackConfigError(
            f"no stack {stack!r}: {path} does not exist; stacks here: {', '.join(known) or 'none'}"
        )
    return load_stack_file(path, stack)


def from_pulumi_config(stack: str, config: dict[str, Any]) -> StackConfig:
    """Build the StackConfig from the Pulumi engine's config map (``namespace:key`` → string)."""
    return validate_stack(stack, config, "pulumi config")


def pulumi_config_map() -> dict[str, Any]:
    """The whole config map of the running Pulumi program (PULUMI_CONFIG plus explicit sets)."""
    from pulumi.runtime import config as runtime_config

    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
