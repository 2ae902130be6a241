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


#: The floors of infra/, lowest first, at the scale of its top folders: a module imports only from
#: its own floor or below, and the parts of one floor depend on each other without a cycle. A part
#: is a top folder (``infra.status``: every module under infra/status/), a top-level module
#: (``infra.naming``), or the one exception, the backends' specs (:func:`spec_modules`): each
#: backend's stack keys, which config reads, live in the backend's own package so that a backend is
#: one package. The order is the data flow of the design: cli -> (review | policy) -> what asks a
#: stack's backend for its operations (the program, status, logs, the emulator's driver in
#: infra/local) -> the backends -> what the backends stand on (the components, the planner, the
#: emulated platform of infra/emulated, remote's fan-out) -> startup (the VM's script) -> config ->
#: the backends' specs -> the catalog, names, durations, the VM contract and the readers of outside
#: bytes (infra/readers).
FLOORS: list[list[str]] = [
    [
        "infra",
        "infra.accelerators",
        "infra.naming",
        "infra.bucket_location",
        "infra.credentials",
        "infra.clock",
        "infra.subnets",
        "infra.durations",
        "infra.invocation",
        "infra.stack_naming",
        "infra.vm_contract",
        "infra.readers",
    ],
    ["backends' specs"],
    ["infra.config"],
    ["infra.startup"],
    ["infra.components", "infra.planner", "infra.emulated", "infra.remote"],
    ["infra.backends", "infra.queued_resource"],
    ["infra.__main__", "infra.status", "infra.logs", "infra.local"],
    ["infra.review", "infra.policy"],
    ["infra.cli"],
]
SPECS = "backends' specs"


def part_of(module: str, specs: frozenset[str] = frozenset()) -> str:
    """The part of :data:`FLOORS` that ``module`` belongs to: its top folder (``infra.x``), a
    top-level module itself, or :data:`SPECS` for a module of ``specs``."""
    if module in specs:
        return SPECS
    return ".".join(module.split(".")[:2])


def floor_of(part: str) -> int:
    matches = [floor for floor, parts in enumerate(FLOORS) if part in parts]
    assert matches, f"{part} is on no floor of FLOORS: add it"
    return matches[0]


def upward_imports(graph: dict[str, set[str]], specs: frozenset[str]) -> list[str]:
    """Every import that runs from a lower floor up to a higher one, as ``module -> target``."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if floor_of(part_of(target, specs)) > floor_of(part_of(module, specs))
    ]


def the_specs() -> frozenset[str]:
    return frozenset({"infra.backends.spec", "infra.backends.registry", *spec_modules()})


def test_no_module_imports_from_a_higher_floor():
    upward = upward_imports(import_graph(), the_specs())
    assert upward == [], "imports that climb the floors (tests/test_import_graph.py, FLOORS):\n" + "\n".join(upward)


def test_the_parts_of_one_floor_depend_on_each_other_without_a_cycle():
    specs = the_specs()
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = part_of(module, specs)
        parts.setdefault(source, set())
        parts[source] |= {part_of(target, specs) for target in targets} - {source}
    assert cycles(parts) == []


def test_a_backend_takes_from_the_emulated_platform_only_its_kit():
    # infra/emulated/kit.py is the one face a backend's emulation half may use.
    graph = import_graph()
    taken = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("infra.backends.")
        for target in targets
        if target.startswith("infra.emulated") and target != "infra.emulated.kit"
    )
    assert taken == []


def test_an_import_that_climbs_a_floor_is_found(tmp_path):
    # The check itself, on a tree of its own: an emulated part importing the driver above the
    # backends, and a backend reaching past the kit, are both found; without them, nothing is.
    package = tmp_path / "infra"
    for folder in ("emulated", "local", "backends", "backends/gke"):
        (package / folder).mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for init in ("emulated", "local", "backends", "backends/gke"):
        (package / init / "__init__.py").write_text('"""A package."""\n')
    (package / "emulated" / "kit.py").write_text("from infra.emulated.vm import VM\n")
    (package / "emulated" / "vm.py").write_text("def boot():\n    from infra.local import driver\n    return driver\n")
    (package / "local" / "driver.py").write_text("from infra.backends.gke import emulation\n")
    (package / "backends" / "gke" / "emulation.py").write_text("from infra.emulated.vm import boot\n")
    graph = import_graph(tmp_path)
    assert upward_imports(graph, frozenset()) == ["infra.emulated.vm -> infra.local.driver"]
    assert graph["infra.backends.gke.emulation"] == {"infra.emulated.vm"}  # not the kit: the test above fails on it
    (package / "emulated" / "vm.py").write_text("def boot():\n    return None\n")
    assert upward_imports(import_graph(tmp_path), frozenset()) == []
