"""A stack file's YAML, read safely: what :func:`infra.config.loading.load_stack_file` parses.

A path that is not a regular file (a FIFO, a device) is refused before it is opened, and a file is
read no further than :data:`MAX_FILE_BYTES` (``/proc`` files tell no size). A document of more than
:data:`MAX_NODES` YAML nodes is refused as it is parsed, one that expands to more through its aliases
before it is expanded; an integer longer than :data:`MAX_INT_CHARS` is refused, naming its key path,
before it is converted, and so is a scalar whose tag or spelling makes it a type its text is not
(``!!int abc``, ``0x_``), or a date (YAML 1.1 reads an unquoted ``2024-01-01`` as one, and no key
takes a date: quoted, it is text).

The YAML reader refuses a key repeated in one mapping, as Pulumi's own reader (go-yaml v3)
does, and names both lines. It is PyYAML's SafeLoader with one override rather than
ruamel.yaml: ruamel refuses duplicates too, but its error names the line where the
*mapping* starts, not the first occurrence of the key, points an alias key at its anchor and
spells ``true`` as ``True`` — the one-line message below would need the same bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from infra.readers.files import UnreadableFile, read_bounded, special_kind

#: The project's namespace of stack keys (Pulumi.yaml's ``name``): ``config:`` keys without one are its.
NAMESPACE = "multislice"
#: Largest stack file read (bytes): the shipped ones are about 1 KB.
MAX_FILE_BYTES = 1 << 20
#: Most YAML nodes a stack file may hold, and expand to once aliases are followed: the shipped stacks
#: hold under 200. A few lines of nested aliases can otherwise expand to billions of nodes (the
#: "billion laughs" document), and a megabyte of ``[1,1,…]`` is half a million nodes that take
#: seconds and hundreds of MB to build; the reader stops at the first node past the limit.
MAX_NODES = 10_000
#: Longest integer a stack file may write, in characters (digits, sign, ``0x``, ``_``): every count a
#: key takes has under 20 digits. Checked before the value is built: Python refuses to convert a decimal
#: of over 4,300 digits (a ValueError, not a YAML error); another base (``0x…``, YAML 1.1's sexagesimal
#: ``1:30``, in time quadratic in its length) converts to a number no message can print.
MAX_INT_CHARS = 100
#: Longest key shown in an error message.
_KEY_LIMIT = 100
#: The tag PyYAML's resolver gives a plain scalar that reads as an integer (or ``!!int``).
_INT_TAG = "tag:yaml.org,2002:int"
#: ... as a date (``2024-01-01``, YAML 1.1's timestamps), or ``!!timestamp``: no stack key takes one.
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
#: The scalar tags whose constructor can fail on the text (``!!int abc``, ``0x_``): what each names,
#: and what to write instead (None: nothing to suggest but dropping the tag).
_SCALAR_KINDS: dict[str, tuple[str, str | None]] = {
    _INT_TAG: ("an integer", "an integer"),
    "tag:yaml.org,2002:float": ("a number", "a number"),
    "tag:yaml.org,2002:bool": ("a boolean", "true or false"),
    _TIMESTAMP_TAG: ("a date", None),
    "tag:yaml.org,2002:binary": ("base64 data", None),
}
#: What a constructor of PyYAML's raises on text it cannot convert, besides a YAMLError (``int("abc")``,
#: ``bool_values["maybe"]``, a timestamp's regular expression not matching: ``None.groupdict()``).
_CONSTRUCTOR_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError)
#: Longest scalar text shown in a message.
_TEXT_LIMIT = 60


class StackConfigError(ValueError):
    """A stack file that cannot be used; ``lines`` holds one ``key path: problem`` each."""

    def __init__(self, summary: str, lines: list[str] | None = None):
        self.summary = summary
        self.lines = list(lines or [])
        text = summary if not self.lines else summary + "\n" + "\n".join(f"  {line}" for line in self.lines)
        super().__init__(text)


def long_int(text: str) -> str:
    return f"an integer {len(text):,} characters long; a stack file's integers have at most {MAX_INT_CHARS}"


def short_key(key: str) -> str:
    return key if len(key) <= _KEY_LIMIT else f"{key[: _KEY_LIMIT - 1]}… ({len(key)} characters)"


class DuplicateKeyError(yaml.YAMLError):
    """A key repeated in one YAML mapping (lines are 1-based; keys as written)."""

    def __init__(self, key: str, line: int, first_key: str, first_line: int):
        first = f"first at line {first_line}" if key == first_key else f"same as {first_key!r} at line {first_line}"
        super().__init__(f"duplicate key {short_key(key)!r} at line {line} ({first})")
        self.key, self.line, self.first_key, self.first_line = key, line, first_key, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping, as Pulumi's own YAML reader
    (go-yaml v3) does; PyYAML would silently keep the last value. Keys compare as the
    Python values they load as (so ``1`` and ``true`` collide: one dict cannot hold both).

    It also counts the nodes as it composes them, and stops at the first past :data:`MAX_NODES`
    (an alias counts as one more: it expands to at least one node), so a document of a million
    scalars is refused after ten thousand, not once it is built; and a constructor's own error on a
    scalar (``int("abc")``) becomes a YAML error naming the line and the tag."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.nodes = 0
        self.aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
        else:
            self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ExpansionError(
                f"holds more than {MAX_NODES:,} YAML nodes (keys, values and list items); a stack file holds a few "
                "hundred"
            )
        if self.nodes + self.aliases > MAX_NODES:
            raise ExpansionError(_through_aliases(MAX_NODES))
        event = self.peek_event()
        node = super().compose_node(parent, index)
        if node is not None and not isinstance(event, yaml.AliasEvent):
            # The tag as written (None: none written), which the composed node no longer tells apart
            # from the one YAML 1.1 resolves: infra.readers.engine_config reads it as Pulumi's reader does.
            node.written_tag = getattr(event, "tag", None)  # pyright: ignore[reportAttributeAccessIssue]
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_ERRORS as err:
            raise yaml.YAMLError(
                f"cannot read the value tagged {_short_tag(node.tag)} ({_where(node)}): {type(err).__name__}: {err}"
            ) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # ``!!map x``: the base constructor says so
            return super().construct_mapping(node, deep=deep)
        seen: dict[Any, tuple[int, str]] = {}
        key_nodes: set[int] = set()
        previous_line = 0
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line
            if line < previous_line or id(key_node) in key_nodes:
                line = value_node.start_mark.line  # an alias: its node is the anchor's, written earlier
            previous_line = line
            key_nodes.add(id(key_node))
            key = self.construct_object(key_node, deep=True)
            written = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: the base constructor reports it
            if first is not None:
                raise DuplicateKeyError(written, line + 1, first[1], first[0] + 1)
            seen[key] = (line, written)
        return super().construct_mapping(node, deep=deep)


class ExpansionError(yaml.YAMLError):
    """A YAML document of more than :data:`MAX_NODES` nodes, or that expands to more through its
    aliases, or whose aliases refer to a node that contains them."""


def _through_aliases(limit: int) -> str:
    return (
        f"expands to more than {limit:,} YAML nodes through its aliases; a stack file holds a few hundred: write the "
        "values out instead of nesting aliases"
    )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_nodes(root: yaml.Node, limit: int = MAX_NODES) -> int:
    """How many nodes the composed document ``root`` becomes once every alias is followed
    (an alias shares its anchor's node, so the node graph stays as small as the text while
    the loaded value may not). Iterative and memoized: linear in the graph, not the expansion.

    Raises:
      ExpansionError: more than ``limit`` nodes, or an alias inside the node it refers to.
    """
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            visiting.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > limit:
                raise ExpansionError(_through_aliases(limit))
            continue
        if key in sizes:
            continue
        if key in visiting:
            raise ExpansionError(
                f"has an alias at line {node.start_mark.line + 1} inside the node it refers to (a recursive "
                "value): write the values out"
            )
        visiting.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


class ScalarError(yaml.YAMLError):
    """A scalar of a stack file that cannot be what YAML reads it as, or is what no key takes: an
    integer longer than :data:`MAX_INT_CHARS`, text its tag or spelling makes a type it is not
    (``!!int abc``, ``0x_``), a date in ``config:``. ``line`` is ``key path: problem``."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


def check_scalars(root: yaml.Node, loader: yaml.SafeLoader) -> None:
    """Refuse, before anything converts it, a scalar of the composed document ``root`` that is an
    integer longer than :data:`MAX_INT_CHARS`, whose text ``loader``'s constructor for its tag refuses
    (``!!int abc``, ``!!bool maybe``, ``0x_``), or that is a date inside ``config:`` (YAML 1.1 reads an
    unquoted ``2024-01-01`` as one, and no key takes a date). Iterative; each node is visited once
    (an alias shares its anchor's).

    Raises:
      ScalarError: the first such scalar in document order, named by its key path: the ``config:``
        key as :func:`validate_stack` names it, then ``.``-joined keys and list indexes
        (``multislice:training.steps``), with its line and column.
    """
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            problem = _scalar_problem(node, loader, in_config=len(path) >= 2 and path[0] == "config")
            if problem is not None:
                raise ScalarError(f"{_key_path(path)}: {problem}")
        elif isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                name = short_key(key.value) if isinstance(key, yaml.ScalarNode) else "(a non-scalar key)"
                stack.extend([(value, (*path, name)), (key, (*path, name))])
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, str(index))) for index, item in reversed(list(enumerate(node.value))))


def _scalar_problem(node: yaml.ScalarNode, loader: yaml.SafeLoader, in_config: bool) -> str | None:
    """What :func:`check_scalars` refuses in ``node`` (without its key path), or None."""
    if node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
        return f"is {long_int(node.value)}"
    if node.tag not in _SCALAR_KINDS:
        return None
    kind, example = _SCALAR_KINDS[node.tag]
    # The tag YAML gives the text by itself (no tag written, or the one it would get anyway).
    implicit = node.style is None and loader.resolve(yaml.ScalarNode, node.value, (True, False)) == node.tag
    text = _shown(node.value)
    written = text if implicit else f"{_short_tag(node.tag)} {text!r}"
    if implicit and in_config and node.tag == _TIMESTAMP_TAG:  # a valid date or not (2024-02-30)
        return (
            f"{written} ({_where(node)}) is a date to YAML, and no stack key takes a date: quote it ('{text}') to "
            "give text"
        )
    try:
        loader.yaml_constructors[node.tag](loader, node)
    except (yaml.YAMLError, *_CONSTRUCTOR_ERRORS):
        instead = f", or write {example}" if example else ""
        if implicit:
            return f"{written} ({_where(node)}) reads as {kind} in YAML but is not one: quote it to give text{instead}"
        return f"{written} ({_where(node)}) is not {kind}: drop the tag{instead}"
    if in_config and node.tag == _TIMESTAMP_TAG:
        return f"{written} ({_where(node)}) is a date, and no stack key takes a date: drop the tag"
    return None


def _shown(text: str) -> str:
    return text if len(text) <= _TEXT_LIMIT else f"{text[: _TEXT_LIMIT - 1]}… ({len(text):,} characters)"


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:int`` → ``!!int`` (as written); another tag as is."""
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _key_path(path: tuple[str, ...]) -> str:
    """``("config", "training", "steps")`` → ``multislice:training.steps`` (outside ``config:``, as written)."""
    if len(path) >= 2 and path[0] == "config":
        key = path[1] if ":" in path[1] else f"{NAMESPACE}:{path[1]}"
        return ".".join([key, *path[2:]])
    return ".".join(path) or "(top level)"


def load_yaml(text: str, name: str, check: Callable[[yaml.Node, yaml.SafeLoader], None] | None = None) -> Any:
    """The document ``text`` (named ``name`` in error marks), read with the bounds above; ``check`` is
    called with the composed document and the loader (a stack file's:
    :func:`infra.readers.engine_config.check_agreement`), once it is constructed (the constructor refuses
    repeated keys first, and flattens merge keys into their mappings).

    Raises:
      yaml.YAMLError: a syntax error, or one of the subclasses above; ``check``'s own errors.
    """
    loader = _UniqueKeyLoader(text)
    loader.name = name  # error marks say the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_nodes(node)  # before constructing: the expansion is what exhausts memory
        check_scalars(node, loader)  # before constructing: int() refuses, or is slow on, a long one
        data = loader.construct_document(node)  # merge keys are flattened into their mappings here
        if check is not None:
            check(node, loader)
        return data
    finally:
        loader.dispose()


def check_file(path: Path, mode: int | None = None) -> None:
    """Refuse ``path`` unless it is a regular file (symbolic links followed), from its ``stat``
    alone: opening a FIFO for reading waits for a writer, and reading ``/dev/zero`` never ends.

    Raises:
      StackConfigError: it does not exist, cannot be looked up, is a directory or another kind of file.
    """
    if mode is None:
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the path
            raise StackConfigError(f"stack file {path} does not exist") from None
        except OSError as err:  # a loop of symbolic links, a folder it may not search, …
            raise StackConfigError(f"stack file {path} cannot be read: {err.strerror or err}") from None
    _refuse_kind(path, special_kind(mode))


def _refuse_kind(path: Path, kind: str | None) -> None:
    if kind == "a directory":
        raise StackConfigError(f"stack file {path} is a directory, not a Pulumi.<stack>.yaml file")
    if kind is not None:
        raise StackConfigError(f"stack file {path} is not a regular file ({kind}); give a Pulumi.<stack>.yaml file")


def read_stack_text(path: Path) -> str:
    """The text of the stack file ``path``: a regular file (:func:`check_file`, before it is opened,
    and :func:`infra.readers.files.read_bounded` on the open file, in case it was replaced), at most
    :data:`MAX_FILE_BYTES` long, UTF-8, its line ends read as :meth:`Path.read_text` reads them.

    Raises:
      StackConfigError: a special or oversized file, or one that cannot be opened or read.
      UnicodeDecodeError: not UTF-8.
    """
    check_file(path)
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise StackConfigError(f"stack file {path} does not exist") from None
    except UnreadableFile as err:
        _refuse_kind(path, err.kind)
        if err.too_long:
            size = f"{err.size:,} bytes" if err.size is not None else f"over {MAX_FILE_BYTES:,} bytes"
            raise StackConfigError(
                f"stack file {path} is {size}; a stack file is a few KB (at most {MAX_FILE_BYTES:,} bytes are read)"
            ) from None
        raise StackConfigError(f"stack file {path} cannot be read: {err.why}") from None
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """``err``, a YAML error in ``text``, in one line: the problem and where (line and column, 1-based),
    with what was being read (``while parsing a flow sequence`` at its line), without PyYAML's quoted
    lines and carets; a character YAML does not allow (a NUL, a control character) by its code point."""
    if isinstance(err, yaml.reader.ReaderError):
        before = text[: err.position]
        line, column = before.count("\n") + 1, err.position - (before.rfind("\n") + 1) + 1
        return f"the character U+{err.character:04X} (line {line}, column {column}) is not allowed in YAML: remove it"
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = (err.problem or err.context or "not YAML").strip()
        context = err.context.strip() if err.context and err.problem else ""
        if context and err.context_mark is not None:
            context += f" at line {err.context_mark.line + 1}"
        return f"{problem}{where}" + (f", {context}" if context else "")
    return " ".join(str(err).split())
