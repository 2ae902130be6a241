"""Project layout rules that keep the VM bundle self-contained."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


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
    "cli": "infra/cli",
    "components": "infra/components",
    "config": "infra/config",
    "local": "infra/local",
    "planner": "infra/planner",
    "policy": "infra/policy",
    "program": "infra/__main__.py",
    "queued_resource": "infra/queued_resource",
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
