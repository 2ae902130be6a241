"""Validation helpers shared by every config model: strictness and one-line error messages.

:class:`StrictModel` rejects unknown keys, refuses booleans where a number is expected and
makes instances immutable; :data:`ConfigBool` is the boolean every config key takes (``true`` or
``false``, nothing pydantic's lax mode reads as one); :func:`invalid` raises a cross-field error that
points at a key path; :func:`format_errors` turns a pydantic ``ValidationError`` into
``"<key path>: <what is wrong and what is allowed>"`` lines (an unknown key names the nearest
allowed one, a snake_case spelling its camelCase key; a long value is shortened, never echoed whole:
:func:`shorten`). Used by the trainer's
``TrainConfig`` (``training.config``) and by the stack schema (``infra.config``), which is
why it lives in ``training/``: the trainer ships to the VMs and never imports ``infra/``.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from training.redaction import redacted


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


#: The texts a boolean key takes besides a boolean: what the Pulumi Python SDK's own
#: ``Config.get_bool`` reads (``pulumi/config.py``, ``_get_bool``: ``"true"``/``"True"`` and
#: ``"false"``/``"False"``, anything else a ``ConfigTypeError``), and so what the Pulumi engine hands
#: the program for a YAML boolean of the stack file (``true``).
BOOLEAN_TEXTS = {"true": True, "True": True, "false": False, "False": False}


def config_bool(value: Any) -> Any:
    """A config key's boolean: ``True``/``False``, or one of :data:`BOOLEAN_TEXTS`; ``None`` passes
    (an optional key's "unset").

    pydantic's lax mode would read ``"yes"``, ``"on"``, ``"1"``, ``1`` or ``"t"`` as true: in a stack
    file each is a value the platform's own reader (Pulumi's ``get_bool``) refuses, or a typo.

    Raises:
      ValueError: anything else, shown shortened and without secrets (:func:`training.redaction.redacted`).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in BOOLEAN_TEXTS:
        return BOOLEAN_TEXTS[value]
    shown = shorten(redacted(value), 60) if isinstance(value, str) else shorten(value, 60)
    raise ValueError(f"got {shown}; takes true or false (as Pulumi's Config.get_bool reads it)")


#: A boolean config key (:func:`config_bool`); ``ConfigBool | None`` for one that may be unset.
ConfigBool = Annotated[bool, BeforeValidator(config_bool)]


def invalid(path: str, message: str) -> PydanticCustomError:
    """An error for a cross-field rule, pointing at ``path`` below the model that raised it.

    Raise it from a ``model_validator``; :func:`format_errors` joins the model's location and
    ``path`` into one dotted key path.
    """
    return PydanticCustomError("multislice_config", "{message}", {"path": path, "message": message})


#: Longest ``repr`` of a value an error message shows; longer ones are cut (:func:`shorten`).
VALUE_LIMIT = 200
#: Longest error line: a message never carries a whole large value.
LINE_LIMIT = 1000


def shorten(value: Any, limit: int = VALUE_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``…`` and the full length when longer:
    error messages name a value, never echo a huge one (a stack file can expand a few bytes
    into megabytes through YAML aliases), nor a secret it carries (:func:`training.redaction.redacted`)."""
    full = repr(value)
    # Without a password or token it carries (training.redaction), even cut: every shape is far shorter than the
    # margin redacted past the cut, and a huge value is not scanned whole.
    text = redacted(full[: limit + 1024])
    if len(full) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(full)} characters)"


def _model_at(model: type[BaseModel] | None, loc: list[str]) -> type[BaseModel] | None:
    """The model class that holds the key at ``loc`` (its last part), walking fields by alias
    or name from ``model``; None where the path leaves models (a dict, a list)."""
    for part in loc[:-1]:
        if model is None:
            return None
        field = next(
            (f for name, f in model.model_fields.items() if part in (name, f.alias)),
            None,
        )
        if field is None:
            return None
        model = _model_class(field.annotation)
    return model


def _model_class(annotation: Any) -> type[BaseModel] | None:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    return next((m for m in members if isinstance(m, type) and issubclass(m, BaseModel)), None)


def unknown_key_message(key: str, allowed: list[str], spell: str = "{}") -> str:
    """``unknown key (did you mean <nearest>?)`` when one allowed key is close (difflib, as the
    stack keys' namespaces are matched), else ``unknown key; allowed keys: …``. ``spell``
    formats a suggestion (e.g. ``"multislice:{}"``)."""
    return _did_you_mean(key, allowed, spell) or _allowed_keys(allowed, spell)


def _did_you_mean(key: str, allowed: list[str], spell: str) -> str | None:
    head, *rest = key.split("_")
    camel = head + "".join(part[:1].upper() + part[1:] for part in rest)
    # A snake_case spelling of a camelCase key (``min_slices``): that key, whatever difflib ranks first.
    close = [camel] if rest and camel in allowed else difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"unknown key (did you mean {spell.format(close[0])}?)" if close else None


def _allowed_keys(allowed: list[str], spell: str) -> str:
    return f"unknown key; allowed keys: {', '.join(spell.format(k) for k in allowed)}"


#: Most unknown-key lines one error shows; the others are counted in one line (:class:`UnknownKeys`).
UNKNOWN_KEYS_SHOWN = 20


class UnknownKeys:
    """The unknown-key lines of one error: a file of thousands of made-up keys gives a few lines, not
    megabytes. Each key names its nearest allowed key (:func:`unknown_key_message`); the allowed keys
    are listed with the first key that has none near it, and only referred to after that; past
    ``limit`` keys, :meth:`summary` counts the rest."""

    def __init__(self, limit: int = UNKNOWN_KEYS_SHOWN):
        self.limit = limit
        self.count = 0
        self._listed: set[tuple[str, ...]] = set()

    def message(self, key: str, allowed: list[str] | None, spell: str = "{}") -> str | None:
        """The problem to show for ``key`` (as :func:`unknown_key_message`; ``unknown key`` alone
        where the allowed keys are not known), or None past the limit."""
        self.count += 1
        if self.count > self.limit:
            return None
        if allowed is None:
            return "unknown key"
        nearest = _did_you_mean(key, allowed, spell)
        if nearest is not None:
            return nearest
        listing = (spell, *allowed)
        if listing in self._listed:
            return "unknown key (allowed keys listed above)"
        self._listed.add(listing)
        return _allowed_keys(allowed, spell)

    def summary(self) -> list[str]:
        """``… and <n> more unknown keys`` when keys past the limit were left out, else nothing."""
        hidden = self.count - self.limit
        if hidden <= 0:
            return []
        return [f"… and {hidden:,} more unknown key{'' if hidden == 1 else 's'}"]


def format_errors(error: pydantic.ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """One ``"<key path>: <what is wrong and what is allowed>"`` line per validation error.

    Args:
      error: the pydantic error.
      prefix: prepended to every key path (e.g. ``"multislice:training"``).
      model: the model that was validated; with it an unknown key names the nearest allowed
        key of its model (or lists them), as a typo'd stack key does.

    Values in the messages are shortened (:func:`shorten`) and each line is at most
    :data:`LINE_LIMIT` characters. Unknown keys past the first :data:`UNKNOWN_KEYS_SHOWN` are
    counted in one last line, and a model's allowed keys are listed once (:class:`UnknownKeys`).
    """
    lines = []
    unknown = UnknownKeys()
    for item in error.errors(include_url=False):
        loc = [str(part) for part in item["loc"]]
        ctx = item.get("ctx") or {}
        if item["type"] == "multislice_config" and ctx.get("path"):
            loc.append(str(ctx["path"]))
        path = ".".join([prefix, *loc] if prefix else loc).replace(":.", ":")
        message = item["msg"]
        if item["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        given = item.get("input")
        if item["type"] == "extra_forbidden":
            parent = _model_at(model, loc) if loc else None
            allowed = None if parent is None else [f.alias or name for name, f in parent.model_fields.items()]
            message = unknown.message(loc[-1] if loc else "", allowed, "{!r}")
            if message is None:
                continue  # past the limit: counted in the summary line
        elif item["type"] == "literal_error":
            message = f"got {shorten(given)}; " + message.replace("Input should be", "allowed:")
        elif given is not None and len(repr(given)) > VALUE_LIMIT:
            message = message.replace(repr(given), shorten(given))
        # a message quotes the value it refuses: never with a secret it carries (training.redaction)
        line = redacted(f"{path or '(top level)'}: {message}")
        lines.append(line if len(line) <= LINE_LIMIT else line[: LINE_LIMIT - 1] + "…")
    return lines + unknown.summary()
