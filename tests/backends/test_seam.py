"""The backend seam: one registry, and no backend name compared anywhere else.

A backend is one package of infra/backends/ behind :class:`infra.backends.interface.Backend` and
:class:`infra.backends.spec.BackendSpec`; the code outside asks the registry for the stack's backend
and calls it. These tests read the source: a comparison of a backend name (``config.backend ==
"compute-engine"``, ``backend in ("queued-resource", …)``, a dict keyed by backend names, a
``match`` on one, a shell ``[[ $backend == compute-engine ]]``) outside infra/backends/ fails here,
and so does a registry that disagrees with itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from infra.backends.interface import Backend
from infra.backends.operations import BACKENDS, backend, backend_of, operations_of
from infra.backends.registry import DEFAULT, NAMES, SPECS
from infra.backends.spec import BackendSpec
from infra.config import BACKENDS as CONFIG_BACKENDS
from infra.startup.templates import BOOT_RESOURCE, template

ROOT = Path(__file__).resolve().parents[2]
SEAM = ROOT / "infra" / "backends"
#: The catalog keeps, per generation, which backends offer it and the facts each backend reads
#: (infra/accelerators/generation.py checks those records are complete for the backends they name:
#: a runtime version where the queued resource offers a generation, machine types and zones where
#: Compute Engine does). The specs answer from these facts; nothing else is decided there.
CATALOG = ROOT / "infra" / "accelerators" / "generation.py"


def backend_constants(paths: list[Path]) -> set[str]:
    """Names bound at module level to a backend name (``COMPUTE_ENGINE = "compute-engine"``)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_name(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _is_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in NAMES


def comparisons(source: str, constants: set[str]) -> list[int]:
    """Line numbers of ``source`` (Python) that tell backends apart by name (see the module docstring)."""

    def names_a_backend(node: ast.AST) -> bool:
        if _is_name(node):
            return True
        if isinstance(node, ast.Name) and node.id in constants:
            return True
        if isinstance(node, ast.Attribute) and node.attr in constants:
            return True
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_backend(element) for element in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_a_backend(n) for n in (node.left, *node.comparators)):
            found.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(key is not None and names_a_backend(key) for key in node.keys):
            found.append(node.lineno)
        elif isinstance(node, ast.match_case) and names_a_backend(getattr(node.pattern, "value", None) or ast.Pass()):
            found.append(node.pattern.lineno)
    return found


def shell_comparisons(text: str) -> list[int]:
    """Line numbers of a shell template that compare a value with a backend name."""
    names = "|".join(re.escape(name) for name in NAMES)
    pattern = re.compile(rf"(==|!=|=~)\s*['\"]?({names})\b|^\s*['\"]?({names})['\"]?\)", re.M)
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def outside_the_seam() -> tuple[list[Path], list[Path]]:
    python = [
        p
        for p in sorted((ROOT / "infra").rglob("*.py")) + sorted((ROOT / "training").rglob("*.py"))
        if SEAM not in p.parents and p != CATALOG
    ]
    shell = [p for p in sorted((ROOT / "infra").rglob("*.sh*")) if SEAM not in p.parents]
    return python, shell


def test_no_code_outside_the_seam_compares_a_backend_name():
    python, shell = outside_the_seam()
    constants = backend_constants(python + [CATALOG])
    found = [f"{p.relative_to(ROOT)}:{line}" for p in python for line in comparisons(p.read_text(), constants)]
    found += [f"{p.relative_to(ROOT)}:{line}" for p in shell for line in shell_comparisons(p.read_text())]
    assert found == [], "backend names compared outside infra/backends/ (ask the registry instead):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('if config.backend == "compute-engine":\n    pass\n', [1]),
        ('x = "queued-resource" != backend\n', [1]),
        ('ok = backend in ("queued-resource", "gke")\n', [1]),
        ('why = {"compute-engine": "a", "queued-resource": "b"}[offered]\n', [1]),
        ('match backend:\n    case "compute-engine":\n        pass\n', [2]),
        ("if backend == contract.COMPUTE_ENGINE_BACKEND:\n    pass\n", [1]),
        ("if COMPUTE_ENGINE in gen.backends:\n    pass\n", [1]),
        # Not comparisons: a default, a message, the registry asked.
        ('Field(default="queued-resource")\nprint("set multislice:backend: compute-engine")\n', []),
        ("if backend_of(config).spec.release_watch:\n    pass\n", []),
    ],
)
def test_the_check_finds_every_form_of_comparison(source, lines):
    assert comparisons(source, {"COMPUTE_ENGINE_BACKEND", "COMPUTE_ENGINE"}) == lines


def test_the_check_fails_on_a_scratch_comparison(tmp_path):
    """A comparison added to a real module outside the seam is found (the check is not vacuous)."""
    module = ROOT / "infra" / "status" / "report.py"
    scratch = module.read_text() + '\n\nif __name__ == "compute-engine" or __name__ != "queued-resource":\n    pass\n'
    assert len(comparisons(scratch, set())) == 2 + len(comparisons(module.read_text(), set()))
    boot = template(BOOT_RESOURCE)  # both files of boot.sh
    assert shell_comparisons(boot) == []
    assert len(shell_comparisons(boot + "\nif [[ $backend == compute-engine ]]; then :; fi\n")) == 1
    assert len(shell_comparisons("case $backend in\n  compute-engine) ;;\nesac\n")) == 1


def test_one_registry_lists_every_backend_package_once():
    # The registry's one list is every package of infra/backends/ that has a spec (a package left
    # out of it, or listed twice, fails here); the operations follow it, in its order.
    packages = sorted(path.parent.name for path in SEAM.glob("*/spec.py"))
    assert sorted(type(spec).__module__.split(".")[2] for spec in SPECS.values()) == packages
    assert list(BACKENDS) == list(SPECS) == list(NAMES) == list(CONFIG_BACKENDS)
    assert DEFAULT == NAMES[0]
    for name, each in BACKENDS.items():
        assert isinstance(each, Backend) and isinstance(each.spec, BackendSpec)
        assert each.spec is SPECS[name] and each.name == name and backend(name) is each
        assert type(each).__module__ == f"infra.backends.{name.replace('-', '_')}.backend"
        assert type(each.spec).__module__ == f"infra.backends.{name.replace('-', '_')}.spec"


def test_a_package_that_breaks_the_convention_is_refused_by_name(monkeypatch):
    # The operations are the BACKEND of backend.py beside the registered spec.py: another backend's
    # there (or none) stops the lookup with a line naming the module.
    from infra.backends.gke import backend as gke_backend

    monkeypatch.setattr(gke_backend, "BACKEND", BACKENDS[DEFAULT])
    with pytest.raises(RuntimeError, match=r"infra\.backends\.gke\.backend\.BACKEND must be the Backend of the "):
        operations_of(SPECS["gke"])
    monkeypatch.delattr(gke_backend, "BACKEND")
    with pytest.raises(RuntimeError, match="found None"):
        operations_of(SPECS["gke"])


def test_a_stacks_backend_is_the_one_its_key_names(tmp_path):
    from infra.config import load_stack
    from tests.helpers.compute_engine_stack import stack_file

    dev = load_stack("dev", ROOT / "stacks")
    assert backend_of(dev) is BACKENDS[DEFAULT] and dev.backend_spec is SPECS[DEFAULT]
    from infra.config import load_stack_file

    ce = load_stack_file(stack_file(tmp_path))
    assert backend_of(ce) is BACKENDS[ce.backend] and ce.backend != DEFAULT


def test_every_capacity_the_config_offers_is_some_backends():
    from infra.config import CAPACITY_TYPES

    offered = {capacity for spec in SPECS.values() for capacity in spec.capacities}
    assert offered == set(CAPACITY_TYPES)
