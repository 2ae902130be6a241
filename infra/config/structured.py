"""The stack keys whose value is a map or a list (:data:`STRUCTURED_KEYS`) and how their values are read.

The Pulumi engine hands such a value to the program as JSON text, and the stack file as YAML: a map
(``multislice:computeEngine: {maxRunDuration: 3d}``) or a list. :func:`parse` reads either, and
tells a scalar written where a map or a list belongs (``multislice:computeEngine: 3d``, which
reaches the program as the text ``3d``, not JSON) from JSON text that is broken (it starts with
``{`` or ``[``): the first is named as the scalar it is, with an example of the key
(:data:`EXAMPLES`), rather than as a JSON error.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable
from typing import Any

import pydantic

from infra.config.schema import StackConfig
from training.redaction import redacted


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of an annotation, ``X | None`` unwrapped (``None`` among them as ``NoneType``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _object_valued(annotation: Any) -> bool:
    return any(
        (isinstance(member, type) and issubclass(member, pydantic.BaseModel))
        or typing.get_origin(member) in (dict, list, tuple)
        for member in _members(annotation)
    )


_FIELDS = {field.alias: field for field in StackConfig.model_fields.values() if field.alias}
#: Keys whose value is an object or a list (Pulumi hands these to programs as JSON text).
STRUCTURED_KEYS = tuple(key for key, field in _FIELDS.items() if _object_valued(field.annotation))
#: A value of each structured key, as a stack file writes it (tests/config/test_messages.py
#: validates each against its key's model).
EXAMPLES = {
    "multislice:training": "{steps: 200}",
    "multislice:network": "{iapSsh: true}",
    "multislice:bucket": "{forceDestroy: true}",
    "multislice:queuedResource": "{waitFor: ACTIVE}",
    "multislice:computeEngine": "{maxRunDuration: 3d}",
    "multislice:gke": "{namespace: training}",
    "multislice:elastic": "{minSlices: 1, shrinkAfter: 2m}",
    "multislice:labels": "{team: ml}",
    "multislice:workload": "{command: [python3, train.py], steps: 100}",
    "multislice:allowUnlisted": "[zone]",
}
#: The longest scalar a message shows; a longer one is named by its length.
_SCALAR_LIMIT = 40


def takes_list(key: str) -> bool:
    """``key`` takes a list (``multislice:allowUnlisted``), not a map."""
    return any(typing.get_origin(member) in (list, tuple) for member in _members(_FIELDS[key].annotation))


def parse(key: str, value: Any, parse_int: Callable[[str], int]) -> Any:
    """The value of the structured key ``key``: JSON text (the engine's) parsed, a map or a list
    (the stack file's) as is, ``None`` where the key may be empty.

    Raises:
      ValueError: the problem, without the key: broken JSON text, an integer ``parse_int`` refuses,
        or a value of the wrong shape (a scalar, a list for a map, a map for a list), with an example.
    """
    text = value if isinstance(value, str) else None
    if text is not None and text.strip():
        try:
            value = json.loads(text, parse_int=parse_int)
        except json.JSONDecodeError as err:
            if text.lstrip().startswith(("{", "[")):
                raise ValueError(f"not a JSON {'list' if takes_list(key) else 'object'} ({err})") from None
            # else a scalar: the YAML ``key: 3d`` arrives as the text 3d
        except ValueError as err:  # parse_int's
            raise ValueError(f"holds {err}") from None
    if value is None and type(None) in _members(_FIELDS[key].annotation):
        return None
    if isinstance(value, (list, tuple) if takes_list(key) else (dict, pydantic.BaseModel)):
        return value  # a model: a StackConfig's own value, validated again
    # A number or a boolean as itself (the engine hands ``3`` and ``true`` over as JSON), other text quoted.
    shown = value if text is None or value is None or isinstance(value, (dict, list, bool, int, float)) else text
    shape = "a list" if takes_list(key) else "a map of keys"
    example = EXAMPLES.get(key, "[value]" if takes_list(key) else "{key: value}")
    raise ValueError(f"{_described(shown)}; it takes {shape}, e.g. {key}: {example}")


def _described(value: Any) -> str:
    """``is the scalar '3d'``, ``is a list``, … (a long scalar by its length)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "is empty"
    if isinstance(value, dict):
        return "is a map"
    if isinstance(value, (list, tuple)):
        return "is a list"
    text = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    if len(text) > _SCALAR_LIMIT:
        return f"is a scalar {len(text):,} characters long"
    return f"is the scalar {redacted(text)}"  # a URL with a password, a token pasted in the wrong key
