"""infra.startup.shipped_source: the trainer ships without docstrings and comments, line for line."""

from __future__ import annotations

import ast
import io
import tokenize
import traceback
from pathlib import Path

import pytest

from infra.startup.bundle import bundle_files, trainer_files
from infra.startup.shipped_source import strip_documentation

ROOT = Path(__file__).resolve().parents[2]


def _without_docstrings(tree: ast.AST) -> str:
    """ast.dump of ``tree`` with every docstring statement dropped (computed independently of
    the module under test: from the AST, not from the text)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


@pytest.mark.parametrize("path", bundle_files(ROOT / "training"), ids=lambda p: p.name)
def test_every_trainer_module_keeps_its_code_and_its_line_numbers(path):
    original = path.read_text()
    shipped = strip_documentation(original.encode()).decode()
    assert shipped.count("\n") == original.count("\n")
    assert _without_docstrings(ast.parse(shipped)) == _without_docstrings(ast.parse(original))
    tokens = list(tokenize.generate_tokens(io.StringIO(shipped).readline))
    assert not [t for t in tokens if t.type == tokenize.COMMENT]
    # every statement starts on the line it starts on in the repository

    def lines(text: str) -> list[tuple[str, int]]:
        return [(type(n).__name__, n.lineno) for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt)]

    assert lines(shipped) == lines(original)


def test_the_bundle_carries_the_stripped_source_and_is_smaller():
    shipped = trainer_files(ROOT / "training")
    raw = sum(p.stat().st_size for p in bundle_files(ROOT / "training"))
    assert sum(map(len, shipped.values())) < raw
    train = shipped["training/train.py"].decode()
    assert '"""' in train and "The resilient training loop" not in train


SAMPLE = '''\
"""Module doc with a non-ASCII sign: ÷ and a hash # inside."""
import os  # why os


def f(x):
    """One line."""
    s = "a # that is data, not a comment"
    return s, x


def g(): """shares its line with code"""; return 2


class C:
    """Several
    lines."""

    def h(self):
        """Doc ÷."""
        raise ValueError("boom")
'''


def test_strings_and_shared_lines_are_kept_and_tracebacks_point_at_the_same_line():
    shipped = strip_documentation(SAMPLE.encode()).decode()
    assert shipped.count("\n") == SAMPLE.count("\n")
    assert "# why os" not in shipped and "Module doc" not in shipped and "Several" not in shipped
    assert '"a # that is data, not a comment"' in shipped
    assert 'def g(): """shares its line with code"""; return 2' in shipped
    namespace: dict = {}
    exec(compile(shipped, "sample.py", "exec"), namespace)
    assert namespace["f"](1) == ("a # that is data, not a comment", 1)
    assert namespace["g"]() == 2
    with pytest.raises(ValueError) as raised:
        namespace["C"]().h()
    line = traceback.extract_tb(raised.tb)[-1].lineno
    assert SAMPLE.splitlines()[line - 1].strip() == 'raise ValueError("boom")'


def test_invalid_python_is_refused():
    with pytest.raises(SyntaxError):
        strip_documentation(b"def f(:\n")
