"""hostir's import graph points one way, room by room, and has no cycle.

    hostir_dialect  <-  hostir.config, hostir.logs  <-  hostir.passes  <-  hostir.runtime
        <-  hostir.frontend, hostir.tools

The package `hostir` itself (its `__init__`: the public API, each name imported when first
used) stands above all of them, and the settings and logs below every room but the dialects.

Every module of the six folders is read with `ast` (none is imported): each `import` and
`from ... import` of a hostir module, at the top of the module or deferred inside a
function, is an arrow from the module to the module it names (to `package.name` where
that is a module). An import under `if TYPE_CHECKING:` is no arrow: it never runs.

* Direction: a module may import its own room and the rooms that `MAY_IMPORT` lists for
  it, below it; any other arrow is reported with both modules and the line.
* Cycles: among the imports made while a module loads, where importing `a.b.c` also runs
  the `__init__` of `a` and `a.b` unless they are packages of the importer (which Python
  has run already). A cycle there may leave a module half made when another reads it.
  A deferred import runs later, once every module it may meet has loaded: the pass
  registry (`hostir.passes`) imports each pass when it is asked for it, as xDSL's does,
  and so names `hir-lowering`, whose module builds on the driver that reads the registry.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
FOLDERS = {
    "hostir": "hostir",
    "hostir_dialect": "hostir_dialect",
    "hostir.passes": "passes",
    "hostir.runtime": "runtime",
    "hostir.frontend": "frontend",
    "hostir.tools": "tools",
}
"""Each package and the folder of the checkout it installs from (pyproject.toml)."""

LOW = ("hostir_dialect", "hostir.config", "hostir.logs", "hostir.version")
"""The dialects, the settings, the logs and the version, which every room of hostir's own may read."""

MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "hostir": ("hostir_dialect", "hostir.passes", "hostir.runtime", "hostir.frontend", "hostir.tools"),
    "hostir.config": ("hostir_dialect",),
    "hostir.logs": ("hostir_dialect", "hostir.config"),
    "hostir.version": (),
    "hostir_dialect": (),
    "hostir.passes": LOW,
    "hostir.passes.analysis": LOW,
    "hostir.passes.fusion": (*LOW, "hostir.passes.analysis", "hostir.passes.options"),
    "hostir.passes.lowering": (*LOW, "hostir.passes.analysis", "hostir.passes.options"),
    "hostir.passes.hir": (*LOW, "hostir.passes.analysis", "hostir.passes.options"),
    "hostir.runtime": (*LOW, "hostir.passes"),
    "hostir.runtime.codegen": LOW,
    "hostir.runtime.distributed": (*LOW, "hostir.passes.analysis", "hostir.runtime.codegen"),
    "hostir.runtime.interpreter": (*LOW, "hostir.runtime.distributed", "hostir.runtime.codegen"),
    "hostir.frontend": (*LOW, "hostir.passes", "hostir.runtime"),
    "hostir.tools": (*LOW, "hostir.passes", "hostir.runtime"),
}
"""Room -> the rooms below it that its modules may import, besides the room itself (a room
holds its sub-rooms: `hostir.runtime`'s own modules may import its interpreter). A module
belongs to the longest room its name starts with."""


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    deferred: bool

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


def modules() -> dict[str, Path]:
    """Every module of hostir's packages by name: a package by its own name (`__init__.py`),
    a script of `tools/` by its file name (`hostir.tools.hir-opt`)."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted((REPOSITORY / folder).rglob("*.py")):
            parts = path.relative_to(REPOSITORY / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, deferred: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements of `tree` that run, and whether each is deferred (in a function)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (item for child in node.orelse for item in _imports(ast.Module([child], []), deferred))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, deferred
        else:
            inner = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(node, inner)


def _is_hostir(name: str) -> bool:
    return name == "hostir_dialect" or name.startswith(("hostir_dialect.", "hostir."))


def arrows(known: dict[str, Path]) -> list[Arrow]:
    """Every import of a hostir module by a module of `known`."""
    found = []
    for source, path in known.items():
        for node, deferred in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level:
                raise AssertionError(f"{source} (line {node.lineno}) imports relatively; hostir names its modules")
            else:
                named = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [name if name in known else node.module for name in named]
            for target in dict.fromkeys(targets):
                if _is_hostir(target):
                    found.append(Arrow(source, target, node.lineno, deferred))
    return found


def room_of(module: str) -> str:
    """The longest room of `MAY_IMPORT` that `module` is in."""
    return max((room for room in MAY_IMPORT if module == room or module.startswith(room + ".")), key=len)


def _within(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def upward(found: list[Arrow]) -> list[str]:
    """The arrows that leave their room for one it may not import, each said in words."""
    wrong = []
    for arrow in found:
        room = room_of(arrow.source)
        if _within(arrow.target, room) or any(_within(arrow.target, below) for below in MAY_IMPORT[room]):
            continue
        allowed = ", ".join(MAY_IMPORT[room]) or "nothing of hostir"
        wrong.append(f"{arrow}: {room} may import only itself and {allowed}")
    return wrong


def _packages(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def load_graph(found: list[Arrow], known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules that loading it runs: what it imports at its top, with the
    `__init__` of their packages that are not its own."""
    graph: dict[str, set[str]] = {module: set() for module in known}
    for arrow in found:
        if arrow.deferred:
            continue
        own = set(_packages(arrow.source))
        for target in (*_packages(arrow.target), arrow.target):
            if target in known and target not in own and target != arrow.source:
                graph[arrow.source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_every_module_belongs_to_a_room_and_is_read():
    known = modules()
    assert {"hostir_dialect.hir", "hostir.passes.analysis.buffers", "hostir.runtime.interpreter.core",
            "hostir.runtime.distributed.communicator", "hostir.frontend.rules.matmuls", "hostir.tools.hir_opt"} <= set(known)
    found = arrows(known)
    assert any(a.source == "hostir.runtime.program" and a.target == "hostir.passes.driver" for a in found)
    assert any(a.source == "hostir.passes" and a.target.startswith("hostir.passes.hir.") and a.deferred for a in found)
    assert all(room_of(module) for module in known)


def test_every_package_is_installed():
    """pyproject.toml lists its packages one by one (setuptools' `package-dir` maps the
    folders to `hostir.*`): a room left out would be missing from an install that is not
    editable, and only there."""
    setuptools = (REPOSITORY / "pyproject.toml").read_text().split("[tool.setuptools]", 1)[1]
    listed = set(re.findall(r'"([\w.]+)"', setuptools.split("packages = [", 1)[1].split("]", 1)[0]))
    packages = {module for module, path in modules().items() if path.name == "__init__.py"}
    assert listed == packages, f"not listed: {sorted(packages - listed)}; listed, not packages: {sorted(listed - packages)}"


def test_imports_point_down_from_room_to_room():
    wrong = upward(arrows(modules()))
    assert not wrong, "imports that point up or across:\n" + "\n".join(wrong)


def test_no_module_imports_itself_back_while_it_loads():
    known = modules()
    found = cycles(load_graph(arrows(known), known))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in found)


def test_the_checks_name_what_they_find():
    """The checks themselves, on a made-up graph: the dialect importing the runtime, a pass
    importing another pass's room, and two modules importing each other as they load."""
    made_up = [
        Arrow("hostir_dialect.hir", "hostir.runtime.program", 3, True),
        Arrow("hostir.passes.hir.x", "hostir.passes.lowering.y", 5, False),
        Arrow("hostir.runtime.a", "hostir.runtime.b", 1, False),
        Arrow("hostir.runtime.b", "hostir.runtime.a", 2, False),
    ]
    wrong = upward(made_up)
    assert wrong == [
        "hostir_dialect.hir (line 3) imports hostir.runtime.program: hostir_dialect may import only itself and nothing of hostir",
        "hostir.passes.hir.x (line 5) imports hostir.passes.lowering.y: hostir.passes.hir may import only itself and "
        "hostir_dialect, hostir.config, hostir.logs, hostir.version, hostir.passes.analysis, hostir.passes.options",
    ]
    known = {name: Path() for name in ("hostir.runtime", "hostir.runtime.a", "hostir.runtime.b")}
    assert cycles(load_graph(made_up[2:], known)) == [["hostir.runtime.a", "hostir.runtime.b"]]
