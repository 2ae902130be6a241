"""A stack file's ``config:`` as the Pulumi engine hands it to the program: one reading for the review
(``plan``, ``check``, ``diff``, ``render``, ``local up``) and the deploy (``pulumi up``).

``pulumi up`` does not give the program the stack file: the engine reads it with Go's YAML library
(gopkg.in/yaml.v3 v3.0.1, a YAML 1.2 reader), writes it out and reads it again, and hands each
``config:`` value over as text (:func:`config_map`). This module reads the file the same way, so that
:func:`infra.config.loading.validate_stack` gets the same strings in both places. Where YAML 1.1 (what a
reader of the file, PyYAML, and many editors take it as) and the engine read a scalar differently, the
scalar is refused in one line naming its key and saying how to write it (:func:`check_agreement`), so a
reviewer never approves a value the deploy reads otherwise.

The engine's rules, from its source (pulumi/pulumi at 1b5949891b3c, 3.259.0; the Python SDK that
``uv.lock`` pins, 3.272.0, reads what the engine hands it and does not parse YAML):

* ``sdk/go/common/workspace/loaders.go`` ``LoadProjectStackBytes``: the document is decoded, every
  ``config:`` key without a namespace gets the project's (``steps`` → ``multislice:steps``), the whole is
  encoded again (``util/yamlutil.YamlEncode``) and decoded into ``ProjectStack``, whose keys are
  ``secretsprovider``, ``encryptedkey``, ``encryptionsalt``, ``config``, ``environment``
  (``workspace/project.go``); any other top-level key is dropped without a word.
* ``sdk/go/common/resource/config/object.go``: a value decoded as a boolean, an integer or a float is
  handed over as its JSON text (``true``, ``24``, ``1.5``), text as itself, a date as Go's
  ``time.Time.String()`` (``2024-01-01 00:00:00 +0000 UTC``), a map or a list as JSON (keys sorted),
  ``.inf`` and ``.nan`` not at all (``json: unsupported value``: the engine refuses the stack); an empty
  value becomes the empty text (``loaders.go`` ``checkForEmptyConfig`` warns so).
* ``resource/config/key.go`` ``ParseKey``: a key is ``<namespace>:<name>``, or the old
  ``<namespace>:config:<name>``.
* gopkg.in/yaml.v3 v3.0.1 ``resolve.go``: only ``true``/``false`` (and their capitalized forms) are
  booleans (``yes``, ``on``, ``y`` are text), ``~``/``null``/empty are null, integers are Go's
  ``strconv.ParseInt(s, 0, 64)`` of the text without ``_`` (``0x18``, ``0o17``, ``0b101``, ``010`` octal),
  then unsigned, then floats (``1e3`` is one: YAML 1.1 needs a dot), and there is no base 60 (``1:30`` is
  text); a plain scalar that begins with four digits and ``-`` is tried as a date first.
  ``decode.go``: a quoted or block scalar, or one tagged ``!!str``, is text.

What the engine's writing out and reading again changes: a float prints in Go's shortest form and is
read again (``1e3`` → ``1000``, an integer); :func:`go_number_text` gives the text the program gets.

The test ``tests/readers/test_engine_reading.py`` checks this reading against the engine's own code: a
Go program (``tests/readers/engine_oracle.go``, Pulumi's functions with the real yaml.v3) read a corpus
of odd scalars and the shipped stacks, and its answers are kept as test data.
"""

from __future__ import annotations

import difflib
import json
import math
from typing import Any

import yaml

from infra.readers.go_yaml import DATE_LIKE, INT64, TagMismatch, go_number_text, kind, v3_scalar
from infra.readers.stack_file import NAMESPACE, ScalarError, short_key

#: The top-level keys of a stack file (``ProjectStack`` in pulumi/pulumi ``sdk/go/common/workspace/project.go``).
STACK_FILE_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")
#: Tags a value under ``config:`` may be written with: both readers read these alike (where the text fits).
_PLAIN_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


def _same(yaml11: Any, engine: Any) -> bool:
    if kind(yaml11) in ("integer", "number") and kind(engine) in ("integer", "number"):
        return yaml11 == engine  # exact: an integer of 21 digits is not the float the engine keeps
    return kind(yaml11) == kind(engine) and yaml11 == engine


def _described(value: Any) -> str:
    """YAML 1.1's or the engine's value of a scalar (None, a bool, an int, a float or text) in words."""
    what = kind(value)
    if what in ("text", "null"):
        return {"text": "text", "null": "empty"}[what]
    return f"the {what} {_written(value)}"


def _written(value: Any) -> str:
    """How a stack file writes ``value`` so that both readers agree."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return go_number_text(value) if isinstance(value, float) else str(value)


def check_agreement(root: yaml.Node, loader: yaml.SafeLoader) -> None:
    """Refuse what the engine and YAML 1.1 would read differently in the composed stack file ``root``
    (``loader`` constructs YAML 1.1's values; the document is constructed, so merge keys, which both
    readers merge alike, are flattened): a top-level key the engine drops (``conifg:``), and under
    ``config:`` a key that is not text to both, a tag other than ``!!str``, ``!!int``, ``!!float``,
    ``!!bool``, ``!!null``, ``!!map``, ``!!seq``, a plain scalar that begins like a date, ``.inf`` or
    ``.nan`` (which the engine cannot hand over), an integer outside the 64-bit range, or a scalar the two
    read as different values (``yes``, ``1:30``, ``0o17``, ``1e3``, ``08``).

    Raises:
      ScalarError: the first one, ``key path: what; how to write it``.
    """
    if not isinstance(root, yaml.MappingNode):
        return  # the caller refuses a file that is not a mapping
    for key_node, value_node in root.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key not in STACK_FILE_KEYS:
            raise ScalarError(_top_level_key(key, key_node))
        if key == "config" and isinstance(value_node, yaml.MappingNode):
            _check_config(value_node, loader)


def _top_level_key(key: str | None, node: yaml.Node) -> str:
    shown = "(a key that is not text)" if key is None else short_key(key)
    close = difflib.get_close_matches(key or "", list(STACK_FILE_KEYS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}:?" if close else f"a stack file's keys are {', '.join(STACK_FILE_KEYS)}"
    return f"{shown} (line {node.start_mark.line + 1}): Pulumi ignores this top-level key; {hint}"


def _check_config(config: yaml.MappingNode, loader: yaml.SafeLoader) -> None:
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(config, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        tag = getattr(node, "written_tag", None)
        if tag not in (None, "!") and tag not in _PLAIN_TAGS:
            raise ScalarError(
                f"{_path(path)}: the tag {_short(tag)} ({_where(node)}) is read differently by Pulumi: drop it"
            )
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                name = _key_text(key, path, loader)
                stack.extend([(value, (*path, name))])
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, str(index))) for index, item in reversed(list(enumerate(node.value))))
        elif isinstance(node, yaml.ScalarNode):
            _check_scalar(node, path, loader)


def _key_text(key: yaml.Node, path: tuple[str, ...], loader: yaml.SafeLoader) -> str:
    if not isinstance(key, yaml.ScalarNode):
        raise ScalarError(f"{_path(path)}: a key at {_where(key)} is a map or a list: keys are text")
    yaml11 = loader.yaml_constructors[key.tag](loader, key) if key.tag in loader.yaml_constructors else None
    engine = v3_scalar(key) if key.style is not None or not DATE_LIKE.match(key.value) else None
    if not isinstance(yaml11, str) or not isinstance(engine, str):
        raise ScalarError(
            f"{_path(path)}: the key {short_key(key.value)!r} ({_where(key)}) is not text to YAML: quote it, or name "
            "the key in words"
        )
    return short_key(yaml11)


def _check_scalar(node: yaml.ScalarNode, path: tuple[str, ...], loader: yaml.SafeLoader) -> None:
    key = _path(path)
    written = _shown(node.value)
    plain = node.style is None and getattr(node, "written_tag", None) is None
    if plain and DATE_LIKE.match(node.value):
        raise ScalarError(
            f"{key}: {written} ({_where(node)}) begins like a date, which Pulumi's YAML reader reads as one "
            f"where it can: quote it ('{written}') to give text"
        )
    try:
        engine = v3_scalar(node)
    except TagMismatch:
        raise ScalarError(
            f"{key}: {_short(node.written_tag)} {written!r} ({_where(node)}) is refused by Pulumi's YAML reader: "  # pyright: ignore[reportAttributeAccessIssue]
            "drop the tag, or write a value of that type"
        ) from None
    if isinstance(engine, float) and not math.isfinite(engine):
        raise ScalarError(
            f"{key}: {written} ({_where(node)}) is {'not a number' if math.isnan(engine) else 'infinite'}, which "
            "Pulumi cannot hand to a program (its config is JSON): write a number, or quote it for text"
        )
    yaml11 = loader.yaml_constructors[node.tag](loader, node)
    if kind(yaml11) == "integer" and not INT64[0] <= yaml11 <= INT64[1]:
        raise ScalarError(
            f"{key}: {written} ({_where(node)}) is an integer outside the 64-bit range, which Pulumi does not keep "
            "exactly: write a smaller one, or quote it for text"
        )
    # A value of config: itself reaches the program as text: what matters is the text (YAML 1.1's text 1e-7
    # and the engine's float 1e-7 are both handed over as "1e-7"); inside a map or a list, the JSON value.
    if _same(yaml11, engine) or len(path) == 1 and engine_text(yaml11) == engine_text(engine):
        return
    instead = f"quote it ('{written}') for text"
    if "text" in (kind(engine), kind(yaml11)):
        instead += f", or write {_written(yaml11 if kind(engine) == 'text' else engine)}"
    raise ScalarError(
        f"{key}: {written} ({_where(node)}) is {_described(yaml11)} to YAML 1.1 but {_described(engine)} to "
        f"Pulumi's YAML reader: {instead}"
    )


def _path(path: tuple[str, ...]) -> str:
    """``("training", "steps")`` → ``multislice:training.steps`` (the config key namespaced as Pulumi does)."""
    if not path:
        return "config"
    key = path[0] if ":" in path[0] else f"{NAMESPACE}:{path[0]}"
    return ".".join([key, *path[1:]])


def _shown(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:59]}… ({len(text):,} characters)"


def _short(tag: str | None) -> str:
    tag = tag or ""
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def config_map(data: Any) -> dict[str, Any]:
    """The config map the engine hands the program for the constructed stack file ``data`` (checked by
    :func:`check_agreement`): each key namespaced (``steps`` → ``multislice:steps``,
    ``ns:config:name`` → ``ns:name``), each value text — a scalar as :func:`engine_text`, a map or a list as
    JSON — except a ``{secure: …}`` map, kept as it is (the engine would decrypt it; the caller refuses it).

    Raises:
      ScalarError: a key the engine cannot parse (``a:b:c``), or one written twice (``steps`` and
        ``multislice:steps``: the engine would keep either).
    """
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return {}  # the caller refuses a config: that is not a map
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in config.items():
        full = _engine_key(str(key))
        if full in out:
            raise ScalarError(
                f"{short_key(full)}: written twice ({short_key(written[full])!r} and {short_key(str(key))!r}); Pulumi "
                "would keep either: keep one"
            )
        written[full] = str(key)
        if isinstance(value, dict) and set(value) == {"secure"} and isinstance(value["secure"], str):
            out[full] = value
        else:
            out[full] = engine_text(value)
    return out


def _engine_key(key: str) -> str:
    parts = key.split(":")
    if len(parts) == 1:
        return f"{NAMESPACE}:{key}"
    if len(parts) == 2:
        return key
    if len(parts) == 3 and parts[1] == "config" and parts[0] and parts[2]:
        return f"{parts[0]}:{parts[2]}"
    raise ScalarError(
        f"{short_key(key)}: Pulumi cannot parse this key: a key is <namespace>:<name>, e.g. {NAMESPACE}:slices"
    )


def engine_text(value: Any) -> str:
    """The text the engine hands over for the constructed value ``value``: ``""`` for an empty one,
    ``true``/``false``, an integer's digits, :func:`go_number_text` for a float, text as itself, a map or a
    list as Go's ``json.Marshal`` writes it (keys sorted, ``<``, ``>``, ``&`` escaped)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else _json(value)


#: What Go's ``encoding/json`` escapes in text that Python's ``json.dumps`` leaves as it is.
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _json(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return "null" if value is None else engine_text(value) if isinstance(value, bool) else _written(value)
    if isinstance(value, dict):
        items = sorted((str(k), v) for k, v in value.items())
        return "{" + ",".join(f"{_json(k)}:{_json(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False).translate(_GO_ESCAPES)
