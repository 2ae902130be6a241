"""The trainer's Python source as it ships to the VMs: documentation removed, lines kept.

Everything under ``training/`` (but ``bundle.MACHINE_ONLY_PACKAGES``) travels inside the startup
script (:mod:`infra.startup.bundle`, :mod:`infra.startup`), which we keep under TARGET_SIZE_BYTES
(96 KiB of GCE's 256 KiB); about 40 % of the trainer's compressed size
is docstrings and comments, which the VM never reads. :func:`strip_documentation` blanks them
and keeps every other byte and **every line number**, so a traceback from a TPU VM points at the
same line of the repository's file. Consequences, both intended: a change to a docstring or a
comment alone does not change the release (no VM is restarted for it), and ``__doc__`` of the
shipped modules is the empty string (nothing in ``training/`` reads it; tests/startup/test_bundle.py
checks both).

What is blanked (Python's own definitions,
https://docs.python.org/3/reference/lexical_analysis.html#comments and
https://peps.python.org/pep-0257/#what-is-a-docstring):

* a docstring — the string-literal first statement of a module, class or function — becomes an
  empty string literal spanning the same lines;
* a comment (a ``#`` token found by :mod:`tokenize`, never one inside a string) is removed with
  the whitespace before it. A ``# type:`` or ``# noqa`` comment has no meaning at run time.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator


def strip_documentation(source: bytes) -> bytes:
    """``source`` (UTF-8 Python) without docstrings and comments, same line count.

    Raises:
      SyntaxError: ``source`` is not valid Python (the caller's file, named by the caller).
    """
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    for first, last, col, end_col in sorted(_docstring_spans(ast.parse(text)), reverse=True):
        # ast's columns count UTF-8 bytes
        head = lines[first - 1].encode("utf-8")[:col].decode("utf-8")
        tail = lines[last - 1].encode("utf-8")[end_col:].decode("utf-8")
        if tail.strip() or (head.strip() and not head.rstrip().endswith(":")):
            continue  # shares its lines with code: left as it is
        newline = "\n" if lines[last - 1].endswith("\n") else ""
        blank = '"""' + "\n" * (last - first) + '"""' if last > first else '""'
        lines[first - 1 : last] = [head + blank + newline]
    text = "".join(lines)
    comment_at: dict[int, int] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comment_at[token.start[0]] = token.start[1]
    out = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if number in comment_at:
            newline = "\n" if line.endswith("\n") else ""
            line = line[: comment_at[number]].rstrip() + newline
        out.append(line)
    return "".join(out).encode("utf-8")


def _docstring_spans(tree: ast.Module) -> Iterator[tuple[int, int, int, int]]:
    """(first line, last line, start column, end column) of every docstring in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                assert first.end_lineno is not None and first.end_col_offset is not None  # ast.parse sets them
                yield first.lineno, first.end_lineno, first.col_offset, first.end_col_offset
