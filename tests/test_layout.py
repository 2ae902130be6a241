"""Project layout rules that keep the VM bundle self-contained."""

from __future__ import annotations

import ast
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
