"""No import cycle among the modules of ``infra/``, nor among those of ``training/``: each
package's import graph, read statically from every module's source, is acyclic.

An edge A -> B is any import in A that makes Python execute B: at module level or inside a
function (a lazy import still runs B, only later), ``import infra.x.y`` and
``from infra.x import y`` alike, relative imports resolved. ``from infra.x import y`` goes to
the submodule ``infra.x.y`` when ``y`` is a module or package, else to ``infra.x`` (its
``__init__``). Importing ``infra.x.y`` also executes the packages above it (``infra.x``),
except those that contain A (already being imported when A runs). An import under ``if TYPE_CHECKING:``
is an edge too (a cycle dodged that way is still one). Any cycle fails, naming its modules in
order; a cycle that "works" only thanks to import order is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "infra"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``root``: dotted name -> file."""
    return {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that importing ``name`` (the file ``path``) can execute
    directly: every import statement of the file, wherever it stands."""
    is_package = path.name == "__init__.py"
    own_package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = own_package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
    edges: set[str] = set()
    importer_packages = set(_ancestors(name)) | ({name} if is_package else set())
    for target in targets:
        if target not in modules:
            continue  # outside the package (the other package, third parties, the standard library)
        edges.add(target)
        edges |= {
            p
            for p in _ancestors(target)
            if p in modules and p not in importer_packages and not imports_nothing(modules[p])
        }
    return edges


def imports_nothing(path: Path) -> bool:
    """Whether the module at ``path`` has no import statement (a package's ``__init__`` that is
    only its docstring: executing it runs no other module, so the packages below it are free
    to sit in different layers, as infra/backends/<backend>/ does)."""
    return not any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(ast.parse(path.read_text())))


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = modules_of(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated at the end) per strongly
    connected component that has one (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        components.append(sorted(component))
    return [_a_cycle_in(component, graph) for component in components]


def _a_cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in {component}")


@pytest.mark.parametrize(
    ("package", "known"),
    [("infra", ("infra.cli", "infra.local.lifecycle")), ("training", ("training.data.text", "training.model.kernels"))],
)
def test_no_import_cycle(package, known):
    graph = import_graph(package=package)
    assert set(known) <= set(graph)  # the walk found the packages
    found = cycles(graph)
    assert not found, (
        f"import cycles in {package}/ (an arrow is an import, at module level, in a function or under "
        "TYPE_CHECKING):\n" + "\n".join("  " + " -> ".join(cycle) for cycle in found)
    )


def test_the_graph_sees_every_kind_of_import(tmp_path):
    # The checker itself: a package whose modules import each other only inside functions, by
    # relative and absolute `from` imports, is found cyclic; the same package without the
    # back edge is not.
    package = tmp_path / "infra"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .inner import thing\n")
    (package / "sub" / "inner.py").write_text("def thing():\n    from infra import top\n    return top\n")
    (package / "top.py").write_text("def use():\n    from infra.sub import thing\n    return thing\n")
    (package / "leaf.py").write_text("import infra.sub.inner\n")
    graph = import_graph(tmp_path)
    assert graph["infra.leaf"] == {"infra.sub", "infra.sub.inner"}
    (package / "empty").mkdir()
    (package / "empty" / "__init__.py").write_text('"""A package that imports nothing."""\n')
    (package / "empty" / "mod.py").write_text("")
    (package / "leaf2.py").write_text("import infra.empty.mod\n")
    graph = import_graph(tmp_path)
    assert graph["infra.leaf2"] == {"infra.empty.mod"}  # its empty package runs nothing
    assert graph["infra.sub.inner"] == {"infra.top"}
    assert cycles(graph) == [["infra.sub", "infra.sub.inner", "infra.top", "infra.sub"]]
    (package / "sub" / "inner.py").write_text("def thing():\n    return 1\n")
    assert cycles(import_graph(tmp_path)) == []


def test_a_cycle_in_training_through_a_type_checking_import_is_found(tmp_path):
    # The shape of the config <-> kernels circle training/ once had: one side imports the other
    # only for its annotations.
    package = tmp_path / "training"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("from training.kernels import kernel_problem\n")
    (package / "kernels.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from training.config import ModelConfig\n"
    )
    assert cycles(import_graph(tmp_path, "training")) == [["training.config", "training.kernels", "training.config"]]
    (package / "kernels.py").write_text("def kernel_problem():\n    return None\n")
    assert cycles(import_graph(tmp_path, "training")) == []


def spec_modules() -> list[str]:
    """The registered backends' specs and the modules of their packages they import: the specs'
    layer, found from the registry (a new backend's ``spec.py`` needs no line here)."""
    graph = import_graph()
    found: set[str] = set()
    todo = ["infra.backends.registry"]
    while todo:
        for target in graph[todo.pop()]:
            # A module of a backend's package: infra.backends.<name>.<module>.
            if target.startswith("infra.backends.") and target.count(".") >= 3 and target not in found:
                found.add(target)
                todo.append(target)
    return sorted(found)


#: The layers of infra/, lowest first: a module imports only from its own layer or below, and
#: the units (packages, or top-level modules) of one layer depend on each other without a cycle.
#: The order is the data flow of the design: cli -> (review | policy) -> the modules that ask
#: the backend registry (the program, status's reader and report, the log filter and reader, the
#: emulator) -> the backends (infra/backends: each backend's resources and operations) -> what
#: the backends build on (status's types and store, remote's fan-out, the emulation's VMs and
#: servers) -> (components | planner | logs) -> startup -> config -> the backends' specs (each
#: backend's keys, read by config) -> the catalog, names and the VM contract.
LAYERS: list[list[str]] = [
    [
        "infra",
        "infra.accelerators",
        "infra.naming",
        "infra.bucket_location",
        "infra.credentials",
        "infra.clock",
        "infra.subnets",
    ],
    ["infra.startup.contract", "infra.durations"],
    ["infra.backends.spec", "infra.backends.registry", *spec_modules()],
    ["infra.config", "infra.invocation"],
    ["infra.startup"],
    ["infra.components", "infra.planner", "infra.logs"],
    ["infra.status", "infra.remote", "infra.local"],
    ["infra.backends", "infra.queued_resource"],
    [
        "infra.__main__",
        "infra.status.reader",
        "infra.status.report",
        "infra.logs.filter",
        "infra.logs.cloud",
        "infra.status.plot",
        "infra.local.topology",
        "infra.local.emulated_stack",
        "infra.local.workers",
        "infra.local.repairs",
        "infra.local.lifecycle",
    ],
    ["infra.review", "infra.policy"],
    ["infra.cli"],
]


def unit_of(module: str) -> tuple[int, str]:
    """The layer and the unit (the longest entry of :data:`LAYERS` that contains ``module``)."""
    matches = [
        (layer, unit)
        for layer, units in enumerate(LAYERS)
        for unit in units
        if module == unit or (unit != "infra" and module.startswith(unit + "."))
    ]
    assert matches, f"{module} is in no layer of LAYERS: add it"
    return max(matches, key=lambda match: len(match[1]))


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if unit_of(target)[0] > unit_of(module)[0]
    ]
    assert upward == [], "imports that climb the layers:\n" + "\n".join(upward)


def test_the_units_of_one_layer_depend_on_each_other_without_a_cycle():
    units: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = unit_of(module)[1]
        units.setdefault(source, set())
        units[source] |= {unit_of(target)[1] for target in targets} - {source}
    assert cycles(units) == []
