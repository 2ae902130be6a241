"""Project layout rules that keep the VM bundle self-contained."""

from __future__ import annotations

import ast
import re

from tests.helpers.repo import ROOT, imported_modules


def test_training_never_imports_infra():
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m == "infra" or m.startswith("infra."))
        for path in (ROOT / "training").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_grab_bag_modules():
    names = {path.stem for path in (ROOT / "infra").rglob("*.py")} | {
        path.stem for path in (ROOT / "training").rglob("*.py")
    }
    assert not names & {"utils", "util", "helpers", "misc", "common"}


#: Test folders and what each mirrors: a package of infra/ or training/, or (program) the Pulumi
#: program infra/__main__.py, (config) infra/config with the catalog and naming modules it uses.
TEST_FOLDERS = {
    "backends": "infra/backends",
    "cli": "infra/cli",
    "components": "infra/components",
    "config": "infra/config",
    "emulated": "infra/emulated",
    "local": "infra/local",
    "planner": "infra/planner",
    "policy": "infra/policy",
    "program": "infra/__main__.py",
    "readers": "infra/readers",
    "remote": "infra/remote",
    "startup": "infra/startup",
    "status": "infra/status",
    "training": "training",
}
#: Tests of the repository as a whole, kept at the top of tests/.
TOP_LEVEL_TESTS = {
    "test_import_graph.py",
    "test_layout.py",
    "test_pre_commit.py",
    "test_readme.py",
    "test_xdist_groups.py",
}


#: The longest a module may be: past it a module holds more than one concern (a structure round
#: split the stack config and the program along the backend seam to stay under it).
MAX_MODULE_LINES = 450


#: The modules the next rounds grow (the train loop and its config, the membership gate, the
#: emulator's state, the CLI's local commands, the config schema, the VM boot): each keeps this
#: much room below :data:`MAX_MODULE_LINES`, so that growing one does not force a split mid-feature.
ROOM_TO_GROW = 50
GROWING = (
    "training/train.py",
    "training/config.py",
    "training/membership_gate.py",
    "infra/emulated/state.py",
    "infra/cli/local.py",
    "infra/config/schema.py",
    "infra/startup/boot.sh.in",
)


def module_lengths() -> dict[str, int]:
    """Lines of every Python module and shell script or template of infra/, training/, benchmarks/."""
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("infra", "training", "benchmarks")
        for pattern in ("*.py", "*.sh", "*.sh.in")
        for path in (ROOT / folder).rglob(pattern)
    }


def test_no_module_is_longer_than_the_limit():
    lengths = module_lengths()
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
    assert max(lengths.values()) > MAX_MODULE_LINES // 2  # the walk found the modules
    assert "infra/startup/boot.sh.in" in lengths  # and the shell templates


def test_the_modules_that_grow_next_have_room():
    lengths = module_lengths()
    crowded = {name: lengths[name] for name in GROWING if lengths[name] > MAX_MODULE_LINES - ROOM_TO_GROW}
    assert crowded == {}, f"these modules have less than {ROOM_TO_GROW} lines of room: divide them by concern"


def test_tests_mirror_the_packages():
    tests = ROOT / "tests"
    assert {p.name for p in tests.glob("test_*.py")} == TOP_LEVEL_TESTS
    folders = {p.parent.relative_to(tests).parts[0] for p in tests.rglob("test_*.py") if p.parent != tests}
    assert folders == set(TEST_FOLDERS)
    assert all((ROOT / target).exists() for target in TEST_FOLDERS.values())
    assert all((tests / folder / "__init__.py").exists() for folder in TEST_FOLDERS)


def test_no_test_is_named_after_an_issue():
    issue = re.compile(r"\bissue\s*#?\d|\bissue_?\d", re.I)
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py") if issue.search(p.stem)]
    cited = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*.py")
        if issue.search(p.read_text()) and p.name != "test_layout.py"
    ]
    assert named == [] and cited == []


def imported_test_modules(source: str, package: str) -> list[str]:
    """The test modules (``tests.….test_*``) that ``source``, a module of ``package``, imports,
    at the top or in a function, absolutely or relatively."""
    parts = package.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if _is_test_module(alias.name)}
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if _is_test_module(module):
                found.add(module)
            else:
                found |= {f"{module}.{a.name}" for a in node.names if _is_test_module(f"{module}.{a.name}")}
    return sorted(found)


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts)


def test_no_module_of_the_tests_imports_a_test_module():
    # What several test modules share lives in a module of its own (tests/helpers/, tests/fakes/).
    offenders = {
        str(path.relative_to(ROOT)): imported_test_modules(
            path.read_text(), ".".join(path.relative_to(ROOT).parent.parts)
        )
        for path in (ROOT / "tests").rglob("*.py")
    }
    assert {name: modules for name, modules in offenders.items() if modules} == {}


def test_an_imported_test_module_is_found_in_each_form_of_import():
    source = """
import tests.local.test_a
from tests.training.test_b import corpus
from tests.training import test_c, stacks
from .test_d import STACK
from ..config.test_e import VOCAB
from . import test_f

def later():
    from tests.test_g import ROOT
import tests.helpers.emulation
from tests.helpers.datasets import corpus
from tests.fakes import gcs_server
from .stacks import stack
"""
    assert imported_test_modules(source, "tests.local") == [
        "tests.config.test_e",
        "tests.local.test_a",
        "tests.local.test_d",
        "tests.local.test_f",
        "tests.test_g",
        "tests.training.test_b",
        "tests.training.test_c",
    ]
