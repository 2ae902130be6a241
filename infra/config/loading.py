"""Reading a stack: the stack file (YAML) or the Pulumi engine's config map → StackConfig.

A stack is ``stacks/Pulumi.<stack>.yaml`` (``stackConfigDir: stacks`` in Pulumi.yaml). Its
``config:`` map holds ``gcp:project``, ``gcp:zone`` and the ``multislice:*`` keys. Two paths
read it and must give equal models (tests/config/test_stack_config.py checks this):

* inside ``pulumi up``/``preview``: :func:`from_pulumi_config` reads the engine's config map
  (scalars arrive as strings, objects as JSON text);
* everywhere else (local emulation, ``multislice plan``, rendering): :func:`load_stack` reads the
  YAML file as the engine does (:func:`pulumi_config_of_file`, :mod:`infra.readers.engine_config`),
  refusing what YAML 1.1 and the engine read differently, and validates the same map.

Validation happens before any resource exists. A :class:`StackConfigError` lists every
problem as ``<key path>: <what is wrong; what is allowed>``: a key of a namespace other than
:data:`NAMESPACES` is refused, a misspelt key names the nearest one, and no message echoes a
whole value; thousands of unknown keys give a few lines (:class:`training.validation.UnknownKeys`).
The file's YAML is read by :mod:`infra.readers.stack_file` (special files, sizes, node counts, long
integers, tags and dates, repeated keys); an integer of the engine's JSON longer than
:data:`~infra.readers.stack_file.MAX_INT_CHARS` is refused here, naming its key path, before it is
converted.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import pydantic
import yaml

from infra import stack_naming
from infra.config import structured
from infra.config.errors import StackConfigError
from infra.config.schema import StackConfig
from infra.config.structured import STRUCTURED_KEYS
from infra.readers import engine_config, environment
from infra.readers.files import read_bounded
from infra.readers.stack_file import (
    MAX_FILE_BYTES,
    MAX_INT_CHARS,
    NAMESPACE,
    DuplicateKeyError,
    ExpansionError,
    ScalarError,
    check_file,
    load_yaml,
    long_int,
    read_stack_text,
    short_key,
    yaml_problem,
)
from training.redaction import redacted
from training.validation import UnknownKeys, format_errors

#: Keys of other namespaces that this program reads. All other ``gcp:*`` keys (credentials,
#: impersonation, …) belong to the gcp provider and are left alone.
GCP_KEYS = ("gcp:project", "gcp:zone")
#: Namespaces a stack file may use: the project's own (``multislice:``, the project name; a key
#: without a namespace belongs to it too), the gcp provider's (``gcp:``) and the engine's
#: (``pulumi:``, e.g. ``pulumi:tags``, ``pulumi:disable-default-providers``). Pulumi names
#: config keys ``<namespace>:<key>`` with the project name as the program's namespace
#: (https://www.pulumi.com/docs/iac/concepts/config/). A key in any other namespace would be
#: read by nothing (this program declares no other provider): it is refused, not dropped.
NAMESPACES = (NAMESPACE, "gcp", "pulumi")


#: The checkout's own stacks/ (infra/config/loading.py → the repository root).
_CHECKOUT_STACKS = Path(__file__).resolve().parents[2] / "stacks"


def _allowed_keys() -> list[str]:
    return [f.alias for name, f in StackConfig.model_fields.items() if f.alias]


def validate_stack(stack: str, config: dict[str, Any], source: str, base_dir: Path | None = None) -> StackConfig:
    """Build a StackConfig from a stack's ``config:`` map.

    Args:
      stack: the stack name.
      config: keys as written in the stack file (``"multislice:slices"``); values may be
        typed (YAML) or strings/JSON text (the Pulumi engine).
      source: where the map came from, for the error summary.
      base_dir: what relative paths in the map are relative to (``multislice:workload.source``
        and ``.requirements``): the stack file's directory; default :func:`default_stacks_dir`,
        where ``pulumi up`` reads the stack file from.

    Raises:
      StackConfigError: one line per problem, each naming the key.
    """
    # A stack read from a file keeps its record (stack_naming): the Pulumi program validates the same
    # stack again from its config map, and its hints must still name the file.
    values: dict[str, Any] = {}
    lines: list[str] = []
    unknown = UnknownKeys()  # thousands of them: a few lines, the allowed keys listed once
    allowed = _allowed_keys()
    ours = [k for k in allowed if k.startswith(f"{NAMESPACE}:")]
    for key, value in config.items():
        key = str(key)
        namespace = key.split(":", 1)[0] if ":" in key else NAMESPACE
        full_key = key if ":" in key else f"{NAMESPACE}:{key}"
        if namespace == "gcp" and full_key not in GCP_KEYS:
            continue  # provider configuration, not ours
        if namespace == "pulumi":
            continue  # engine options
        if namespace not in NAMESPACES:
            if unknown.message(key, None) is not None:
                lines.append(redacted(f"{short_key(key)}: {_unknown_namespace(namespace, key)}"))
            continue
        if full_key not in allowed:
            message = unknown.message(full_key.split(":", 1)[1], [k.split(":", 1)[1] for k in ours], "multislice:{}")
            if message is not None:
                lines.append(redacted(f"{short_key(full_key)}: {message}"))  # a key may be a pasted token
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            raise StackConfigError(
                f"stack {stack!r} ({source}) is invalid:",
                [f"{full_key}: secret values are not supported for this key; store it in plain text"],
            )
        if full_key in STRUCTURED_KEYS:
            try:
                value = structured.parse(full_key, value, _bounded_int)
            except ValueError as err:
                lines.append(f"{full_key}: {err}")
                continue
        values[full_key] = value
    for key in ("gcp:project", "gcp:zone", "multislice:acceleratorType"):
        if key not in values:
            lines.append(f"{key}: required key is missing")
    lines += unknown.summary()
    if lines:
        raise StackConfigError(f"stack {stack!r} ({source}) is invalid:", lines)
    try:
        context = {"base_dir": Path(base_dir) if base_dir is not None else default_stacks_dir()}
        return StackConfig.model_validate({"stack": stack, **values}, context=context)
    except pydantic.ValidationError as err:
        raise StackConfigError(
            f"stack {stack!r} ({source}) is invalid:", format_errors(err, model=StackConfig)
        ) from None


def _bounded_int(text: str) -> int:
    """``int(text)`` for :func:`json.loads` (``parse_int``).

    Raises:
      ValueError: ``text`` is longer than :data:`MAX_INT_CHARS`.
    """
    if len(text) > MAX_INT_CHARS:
        raise ValueError(long_int(text))
    return int(text)


def _unknown_namespace(namespace: str, key: str) -> str:
    """Why a key of another namespace is refused, with the nearest namespace when one is close."""
    close = difflib.get_close_matches(namespace, list(NAMESPACES), n=1, cutoff=0.75)
    if close:
        return f"unknown namespace (did you mean {close[0]}:{short_key(key.split(':', 1)[1])}?)"
    return (
        f"unknown namespace {short_key(namespace)!r}: a stack file holds multislice:* keys (this program), "
        "gcp:* keys (the gcp provider) and pulumi:* keys (the engine); nothing reads this one"
    )


def default_stacks_dir() -> Path:
    """``stacks/`` of the project: the nearest Pulumi.yaml above the working directory that
    names this project, else the checkout this package was installed from."""
    env = environment.stacks_dir()
    if env is not None:
        return env
    for parent in [Path.cwd(), *Path.cwd().parents]:
        project = parent / "Pulumi.yaml"
        if project.is_file():
            try:  # any project's file: read as a stack file is (a regular file of 1 MiB, its YAML bounded)
                data = load_yaml(read_bounded(project, MAX_FILE_BYTES).decode("utf-8"), str(project))
            except (OSError, yaml.YAMLError, ValueError, RecursionError):  # ValueError: not UTF-8, a bad int
                continue
            if isinstance(data, dict) and data.get("name") == "multislice":
                return parent / str(data.get("stackConfigDir", "."))
    return _CHECKOUT_STACKS


def stack_file(stack: str, stacks_dir: Path | None = None) -> Path:
    return (stacks_dir or default_stacks_dir()) / f"Pulumi.{stack}.yaml"


def available_stacks(stacks_dir: Path | None = None) -> list[str]:
    directory = stacks_dir or default_stacks_dir()
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load_stack_file(path: Path, stack: str | None = None) -> StackConfig:
    """Read and validate a stack file anywhere on disk, as ``pulumi up`` reads it
    (:func:`pulumi_config_of_file`, then :func:`validate_stack`, as :func:`from_pulumi_config`).

    Args:
      path: a ``Pulumi.<stack>.yaml`` file.
      stack: stack name; by default taken from the file name.

    Raises:
      StackConfigError: :func:`pulumi_config_of_file`'s, or invalid keys.
    """
    path = Path(path)
    check_file(path)  # a device or a FIFO is named as one before its name is judged
    stack = stack_name_of_file(path) if stack is None else stack
    config = validate_stack(stack, pulumi_config_of_file(path, stack), str(path), base_dir=path.absolute().parent)
    stack_naming.remember(config.stack, path, in_stacks_dir=path.absolute() == stack_file(config.stack).absolute())
    return config


def pulumi_config_of_file(path: Path, stack: str | None = None) -> dict[str, Any]:
    """The config map the Pulumi engine hands the program for the stack file ``path``
    (:func:`infra.readers.engine_config.config_map`: ``namespace:key`` → text, a map or a list as JSON; a
    ``{secure: …}`` value as its map), read with the stack file's bounds (:mod:`infra.readers.stack_file`).

    Raises:
      StackConfigError: missing, special (:func:`read_stack_text`) or malformed file (one line, with its
        line and column), one not named ``Pulumi.<stack>.yaml`` (without ``stack``), a scalar that is not
        what YAML reads it as, is a date, or that YAML 1.1 and the engine read differently, an integer
        longer than :data:`MAX_INT_CHARS` (one line naming its key path), a top-level key the engine
        ignores.
    """
    path = Path(path)
    check_file(path)
    stack = stack_name_of_file(path) if stack is None else stack
    text = ""
    try:
        text = read_stack_text(path)
        data = load_yaml(text, str(path), check=engine_config.check_agreement)
        config_map = engine_config.config_map(data)
    except UnicodeDecodeError as err:
        raise StackConfigError(f"stack file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise StackConfigError(f"stack file {path} nests too deeply to be a stack file") from None
    except ScalarError as err:
        raise StackConfigError(f"stack {stack!r} ({path}) is invalid:", [err.line]) from None
    except DuplicateKeyError as err:
        raise StackConfigError(f"stack file {path}: {err}; keep one of them") from None
    except ExpansionError as err:
        raise StackConfigError(f"stack file {path} {err}") from None
    except yaml.YAMLError as err:
        raise StackConfigError(f"stack file {path} is not valid YAML: {yaml_problem(err, text)}") from None
    data = {} if data is None else data  # an empty file: Pulumi reads a stack without config (its keys missing)
    if not isinstance(data, dict) or not isinstance(data.get("config") or {}, dict):
        raise StackConfigError(f"stack file {path} must be a mapping with a 'config:' mapping inside")
    return config_map


def stack_name_of_file(path: Path) -> str:
    """The stack of a file named ``Pulumi.<stack>.yaml``, the one name Pulumi reads a stack's settings from
    (https://www.pulumi.com/docs/iac/concepts/projects/stack-settings-file/).

    Raises:
      StackConfigError: another name (``Pulumi.dev.yml``, ``dev.yaml``), with the name to give it.
    """
    name = path.name
    if name.startswith("Pulumi.") and name.endswith(".yaml") and len(name) > len("Pulumi..yaml"):
        return name[len("Pulumi.") : -len(".yaml")]
    if name.lower() in ("pulumi.yaml", "pulumi.yml"):
        fix = "this is the project file (Pulumi.yaml): give a stack's file, e.g. stacks/Pulumi.dev.yaml"
    else:
        stem = name[len("Pulumi.") :] if name.lower().startswith("pulumi.") else name
        stem = stem.rpartition(".")[0] or stem  # the extension, if any
        stem = stem.rpartition(".")[0] if stem.lower().endswith((".yaml", ".yml")) else stem  # dev.yaml.bak
        fix = f"rename it to Pulumi.{stem}.yaml" if stem else "rename it to Pulumi.<stack>.yaml, e.g. Pulumi.dev.yaml"
    raise StackConfigError(f"stack file {path}: Pulumi reads stack files named Pulumi.<stack>.yaml; {fix}")


def load_stack(stack: str, stacks_dir: Path | None = None) -> StackConfig:
    """Read and validate ``stacks/Pulumi.<stack>.yaml``.

    Raises:
      StackConfigError: the stack does not exist (the message lists those that do), or is invalid.
    """
    path = stack_file(stack, stacks_dir)
    if not path.exists():  # a FIFO or a device is there, and load_stack_file says so
        known = available_stacks(stacks_dir)
        raise StackConfigError(f"no stack {stack!r}: {path} does not exist; stacks here: {', '.join(known) or 'none'}")
    return load_stack_file(path, stack)


def from_pulumi_config(stack: str, config: dict[str, Any]) -> StackConfig:
    """Build the StackConfig from the Pulumi engine's config map (``namespace:key`` → string)."""
    return validate_stack(stack, config, "pulumi config")


def pulumi_config_map() -> dict[str, Any]:
    """The whole config map of the running Pulumi program (PULUMI_CONFIG plus explicit sets)."""
    from pulumi.runtime import config as runtime_config

    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
