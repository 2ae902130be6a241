"""Validation helpers shared by every config model: strictness and one-line error messages.

:class:`StrictModel` rejects unknown keys, refuses booleans where a number is expected and
makes instances immutable; :func:`invalid` raises a cross-field error that points at a key
path; :func:`format_errors` turns a pydantic ``ValidationError`` into
``"<key path>: <what is wrong and what is allowed>"`` lines. Used by the trainer's
``TrainConfig`` (``training.config``) and by the stack schema (``infra.config``), which is
why it lives in ``training/``: the trainer ships to the VMs and never imports ``infra/``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class StrictModel(BaseModel):
    """Base for every config model: unknown keys rejected, instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true/false as 1/0 for int and float fields; in a config
        # file that is always a mistake (``steps: yes`` would train one step).
        if (
            isinstance(value, bool)
            and info.field_name
            and _numeric_not_bool(cls.model_fields[info.field_name].annotation)
        ):
            raise PydanticCustomError(
                "bool_for_number", "got {value}; expected a number, not a boolean", {"value": str(value).lower()}
            )
        return value


def _numeric_not_bool(annotation: Any) -> bool:
    """Whether a field's type takes numbers (int/float, optionally in a union) but not bools."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    members = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    members = tuple(typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members)
    return bool not in members and any(m in (int, float) for m in members)


def invalid(path: str, message: str) -> PydanticCustomError:
    """An error for a cross-field rule, pointing at ``path`` below the model that raised it.

    Raise it from a ``model_validator``; :func:`format_errors` joins the model's location and
    ``path`` into one dotted key path.
    """
    return PydanticCustomError("multislice_config", "{message}", {"path": path, "message": message})


def format_errors(error: pydantic.ValidationError, prefix: str = "") -> list[str]:
    """One ``"<key path>: <what is wrong and what is allowed>"`` line per validation error.

    Args:
      error: the pydantic error.
      prefix: prepended to every key path (e.g. ``"multislice:training"``).
    """
    lines = []
    for item in error.errors(include_url=False):
        loc = [str(part) for part in item["loc"]]
        ctx = item.get("ctx") or {}
        if item["type"] == "multislice_config" and ctx.get("path"):
            loc.append(str(ctx["path"]))
        path = ".".join([prefix, *loc] if prefix else loc).replace(":.", ":")
        message = item["msg"]
        if item["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        elif item["type"] == "literal_error":
            message = f"got {item.get('input')!r}; " + message.replace("Input should be", "allowed:")
        lines.append(f"{path or '(top level)'}: {message}")
    return lines
