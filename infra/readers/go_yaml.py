"""How Go reads a YAML scalar and writes a number: what the Pulumi engine does to a stack file's values.

* gopkg.in/yaml.v3 v3.0.1 (the YAML library pulumi/pulumi pins): ``resolve.go`` ``resolve`` (which
  text is a boolean, null, an integer of Go's ``strconv.ParseInt(s, 0, 64)``, a float, or text) and
  ``decode.go`` ``scalar`` (a quoted or block scalar, or one tagged ``!!str``, is text; another tag must
  fit its text): :func:`v3_plain`, :func:`v3_scalar`;
* Go's ``encoding/json`` form of a float64, as the engine hands a number over: :func:`go_number_text`.

:mod:`infra.readers.engine_config` compares these readings with YAML 1.1's and builds the engine's
config map from them; ``tests/readers/test_engine_reading.py`` checks both against the engine's own code.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import yaml

_STR, _INT, _FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL, _NULL = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
#: yaml.v3 ``resolve.go``: the texts it looks up (when the first character hints so).
_LOOKUP: dict[str, Any] = {
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
#: yaml.v3 ``resolve.go``'s ``resolveTable``: the first characters that make it look further than text.
_HINTED = set("+-0123456789yYnNtTfFoO~.")
#: yaml.v3 ``resolve.go``'s ``yamlStyleFloat``.
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
#: What yaml.v3 tries as a date before anything else (``parseTimestamp``'s quick check).
DATE_LIKE = re.compile(r"[0-9]{4}-")
INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64 = (0, (1 << 64) - 1)
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def go_parse_int(text: str, base: int = 0, *, signed: bool = True) -> int | None:
    """Go's ``strconv.ParseInt(text, base, 64)`` (``ParseUint`` with ``signed=False``): the integer, or
    None where Go returns an error (bad syntax, out of range). With ``base`` 0 the prefix chooses it
    (``0x``, ``0o``, ``0b``, a leading ``0`` is octal). The text has no ``_`` (the caller removed them)."""
    sign, body = 1, text
    if signed and body[:1] in ("+", "-"):
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    if base == 0:
        base = 10
        if body[:2].lower() in ("0x", "0o", "0b"):
            base, body = {"x": 16, "o": 8, "b": 2}[body[1].lower()], body[2:]
        elif len(body) > 1 and body[0] == "0":
            base, body = 8, body[1:]
    if not body or any(c not in _DIGITS[base] for c in body):
        return None
    value = sign * int(body, base)
    low, high = INT64 if signed else _UINT64
    return value if low <= value <= high else None


def _go_parse_float(text: str) -> float | None:
    """Go's ``strconv.ParseFloat(text, 64)`` for the texts yaml.v3 gives it (decimal, no ``_``): None where
    Go returns an error, overflow included (Go answers ±Inf with ``ErrRange``; Python's ``float`` does not)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isinf(value) or math.isnan(value) else value


def v3_plain(text: str) -> Any:
    """The value yaml.v3 v3.0.1 gives an untagged plain scalar (``resolve.go`` ``resolve``): None, a bool,
    an int, a float (``math.inf``/``math.nan`` included) or the text itself. A date-like text (four digits
    and ``-``) is not resolved here: :func:`check_agreement` refuses it first."""
    if text and text[0] not in _HINTED:
        return text
    if text in _LOOKUP:
        return _LOOKUP[text]
    hint = text[:1]
    if hint == ".":
        value = _go_parse_float(text) if re.fullmatch(r"\.[0-9]+([eE][-+]?[0-9]+)?", text) else None
        return text if value is None else value
    if hint not in set("+-0123456789"):
        return text
    plain = text.replace("_", "")
    for parsed in (go_parse_int(plain), go_parse_int(plain, signed=False)):
        if parsed is not None:
            return parsed
    if _YAML_FLOAT.match(plain):
        value = _go_parse_float(plain)
        if value is not None:
            return value
    for prefix, base in (("0b", 2), ("0o", 8)):
        if plain.startswith(prefix):
            parsed = go_parse_int(plain[2:], base) or go_parse_int(plain[2:], base, signed=False)
            if parsed is not None:
                return parsed
        elif plain.startswith("-" + prefix):
            parsed = go_parse_int("-" + plain[3:], base)
            if parsed is not None:
                return parsed
    return text


class TagMismatch(ValueError):
    """yaml.v3 refuses the scalar: a tag its text does not fit (``cannot decode !!str `x` as a !!int``)."""


def v3_scalar(node: yaml.ScalarNode) -> Any:
    """The value yaml.v3 gives ``node`` (``decode.go`` ``scalar``): a quoted or block scalar, or one tagged
    ``!!str``, is text; an untagged plain one :func:`v3_plain`; one tagged ``!!int``, ``!!float``,
    ``!!bool`` or ``!!null`` must resolve to that (an integer may be a ``!!float``).

    Raises:
      TagMismatch: the tag does not fit the text (yaml.v3: ``cannot decode !!str `x` as a !!int``).
    """
    tag = getattr(node, "written_tag", None)
    tag = None if tag == "!" else tag  # the non-specific tag: what the scalar's style makes it
    if tag is None and node.style is not None or tag == _STR:
        return node.value
    value = v3_plain(node.value)
    if tag is None:
        return value
    what = kind(value)
    if tag == _FLOAT and what == "integer":
        return float(value)
    if {_INT: "integer", _FLOAT: "number", _BOOL: "boolean", _NULL: "null"}.get(tag) != what:
        raise TagMismatch(tag)
    return value


def kind(value: Any) -> str:
    """``value``'s kind in words: ``null``, ``boolean``, ``integer``, ``number``, ``text`` (else its type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "text" if isinstance(value, str) else type(value).__name__


def go_number_text(value: float) -> str:
    """The text the engine hands over for the float ``value``: Go's ``encoding/json`` form of the float64
    (shortest digits; positional for 1e-6 ≤ |x| < 1e21, else ``1e+21``, ``1e-7``), ``0`` for zero (the
    engine's YAML round trip reads ``-0`` as the integer 0).

    Raises:
      ValueError: ``value`` is infinite or not a number (the engine refuses such a stack).
    """
    if not math.isfinite(value):
        raise ValueError(f"{value} has no JSON form")
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite
    text = "".join(map(str, digits))
    minus = "-" if sign else ""
    if 1e-6 <= abs(value) < 1e21:
        point = len(text) + exponent  # digits before the decimal point
        if point <= 0:
            return f"{minus}0.{'0' * -point}{text}"
        if point >= len(text):
            return f"{minus}{text}{'0' * (point - len(text))}"
        return f"{minus}{text[:point]}.{text[point:]}"
    power = len(text) - 1 + exponent
    mantissa = text[0] + (f".{text[1:]}" if len(text) > 1 else "")
    return f"{minus}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}".replace("e-0", "e-")
