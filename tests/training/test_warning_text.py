"""training.warning_text: every warning the code gives says whether its reader must act.

The helper words a warning (``…; action needed: …``, ``…; action needed if …: …``, ``…; no action
needed: …``); the source scans below fail on a warning that bypasses it: a logger's ``warning()``, a
``pulumi.log.warn`` or ``warnings.warn`` called directly, a ``WarningText`` made by hand, a ``warning:``
literal in Python (only the helper writes that prefix), and a ``warning:`` line of a VM's shell script
that does not end the same way. ``basedpyright`` checks the rest: ``emit``, ``as_line`` and
``infra.cli.options.print_warning`` take a ``WarningText``, which a plain ``str`` is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.repo import ROOT
from training import warning_text
from training.warning_text import act, as_line, no_action, says_whether_to_act

HELPER = ROOT / "training" / "warning_text.py"
#: The Python sources whose warnings are held to the helper.
PYTHON_FOLDERS = ("infra", "training", "benchmarks")


# --- the helper --------------------------------------------------------------------------------


def test_each_wording_ends_by_saying_whether_to_act():
    assert act("multislice:x is deprecated", "rename it to multislice:y") == (
        "multislice:x is deprecated; action needed: rename it to multislice:y"
    )
    assert act("the subnetwork is shared", "grant roles/compute.networkUser", when="the create fails") == (
        "the subnetwork is shared; action needed if the create fails: grant roles/compute.networkUser"
    )
    assert no_action("a slow machine", "the run is the same") == "a slow machine; no action needed: the run is the same"
    for warning in (act("a", "b"), act("a", "b", when="c"), no_action("a", "b")):
        assert isinstance(warning, warning_text.WarningText) and says_whether_to_act(warning)
        assert as_line(warning) == f"warning: {warning}"


@pytest.mark.parametrize(
    "text",
    [
        "stack dev: predicted DCN-bound (see: multislice plan --stack dev)",
        "the processes list different checkpoints; listing again",
        "a warning; action needed:",  # the action is missing
        "no action needed: why",  # nothing says what happened
    ],
)
def test_a_text_without_the_ending_does_not_say_whether_to_act(text):
    assert not says_whether_to_act(text)


@pytest.mark.parametrize(
    "make",
    [
        lambda: act("", "do it"),
        lambda: act("it broke", " "),
        lambda: act("it broke", "do it", when=""),
        lambda: no_action("it broke", ""),
        lambda: no_action(act("it broke", "do it"), "twice"),  # one ending, not two
    ],
)
def test_a_warning_cannot_leave_out_a_part(make):
    with pytest.raises(ValueError):
        make()


# --- the code's warnings -----------------------------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string statements of ``tree`` (docstrings, attribute docs): not output."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a name or attribute chain, else ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}".lstrip(".")
    return ""


def bypasses(source: str, where: str) -> list[str]:
    """``where:line: what`` for each warning in ``source`` (a Python module) given without
    :mod:`training.warning_text`."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _name(node.func)
            last = callee.rpartition(".")[2]
            if last == "warning" and isinstance(node.func, ast.Attribute):
                found.append((node.lineno, f"{callee}() (emit(<WarningText>, {callee}))"))
            elif callee in ("pulumi.log.warn", "log.warn", "logger.warn", "logging.warn", "warnings.warn", "warn"):
                found.append((node.lineno, f"{callee}() (emit(<WarningText>, {callee}))"))
            elif last == "log" and node.args and _name(node.args[0]).endswith("WARNING"):
                found.append((node.lineno, f"{callee}(WARNING, …) (emit(<WarningText>, <logger>.warning))"))
            elif last == "WarningText":
                found.append((node.lineno, "a WarningText made by hand (act() or no_action())"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if warning_text.PREFIX in node.value:
                found.append((node.lineno, f"a {warning_text.PREFIX!r} literal (as_line(<WarningText>))"))
    return [f"{where}:{number}: {what}" for number, what in sorted(found)]


def python_sources() -> list[Path]:
    return sorted(
        path for folder in PYTHON_FOLDERS for path in (ROOT / folder).rglob("*.py") if path.resolve() != HELPER
    )


def test_every_warning_of_the_python_code_goes_through_the_helper():
    sources = python_sources()
    assert len(sources) > 300 and ROOT / "infra" / "__main__.py" in sources  # the walk found the code
    found = [bypass for path in sources for bypass in bypasses(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_scan_finds_each_way_around_the_helper():
    source = '''
"""A docstring may say warning: without printing it."""
import logging, pulumi, warnings
log = logging.getLogger(__name__)

def f(err, say):
    log.warning("cache %s unusable; going on", err)
    logging.getLogger("x").warning("a")
    pulumi.log.warn(f"stack dev: predicted DCN-bound {err}")
    warnings.warn("old")
    say(f"warning: {err}; trying again")
    WarningText("made by hand")
    log.log(logging.WARNING, "a")
    emit(no_action("fine", "why"), log.warning)  # the one way: not found
'''
    lines = [bypass.split(": ", 1)[0] for bypass in bypasses(source, "m.py")]
    assert lines == [f"m.py:{number}" for number in range(7, 14)]


def shell_warnings() -> dict[tuple[str, int], str]:
    """(file, line number) → line, for each ``warning:`` line a shell script or template of infra/ writes."""
    found = {}
    for pattern in ("*.sh", "*.sh.in"):
        for path in (ROOT / "infra").rglob(pattern):
            for number, text in enumerate(path.read_text().splitlines(), 1):
                if warning_text.PREFIX in text and not text.lstrip().startswith("#"):
                    found[(str(path.relative_to(ROOT)), number)] = text
    return found


def test_every_warning_of_the_vm_scripts_says_whether_to_act():
    lines = shell_warnings()
    assert any(name.endswith("slice_watch.sh") for name, _ in lines)  # the walk found the scripts
    silent = {
        f"{name}:{number}": text.strip() for (name, number), text in lines.items() if not says_whether_to_act(text)
    }
    assert silent == {}
