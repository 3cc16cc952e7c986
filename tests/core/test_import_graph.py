"""The import graph's rules, read statically (AST) from ``dispatch_nb/``, function-level imports too.

Layers: :data:`LAYERS` is the layer diagram of ``docs/architecture.md`` as data (the test reads the
diagram and checks it says exactly this). The **core** (everything in ``dispatch_nb/`` but
``notebook/``) knows nothing of Jupyter; ``notebook/`` is built on the core. Three rules:

(a) nothing in the core imports ``dispatch_nb.notebook`` (its entry points aside: ``__main__`` and
    IPython's ``load_ipython_extension`` / ``unload_ipython_extension`` in ``dispatch_nb/__init__``,
    which hand over to ``notebook/magics.py`` lazily);
(b) no cycle among core modules;
(c) every module belongs to one layer and imports only its own layer and the layers below it
    (:data:`MAY_IMPORT`), never one above.

Every ``import`` / ``from ... import`` counts, wherever it is written: at module level, inside a
function (a lazy import is still a dependency), under ``if TYPE_CHECKING:``. ``from pkg import name``
depends on ``pkg.name`` when that is a module, and on ``pkg`` (its ``__init__``) when ``name`` is not
a module or ``pkg`` is not a package the importer sits in (those have run before it: ``from . import
b`` depends on ``b`` alone); ``import a.b.c`` depends on the deepest of them that is a module. Run
``python tests/core/test_import_graph.py`` for the report on the working tree.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dispatch_nb"
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"

#: The layers, top to bottom, each with its top-level modules and packages (``__init__``: the
#: package's own ``__init__.py``). The diagram in docs/architecture.md lists exactly these.
LAYERS: dict[str, tuple[str, ...]] = {
    "front ends": ("notebook", "__main__", "testing", "demo", "__init__"),
    "operations": ("session", "batching", "cache", "turn", "prompting", "estimates", "budget",
                   "mcp", "approval", "context"),
    "calls": ("adapter", "registry", "http_adapter", "defaults", "providers", "auth",
              "replay_only"),
    "answers": ("structured", "tools", "call_control"),
    "wire": ("wire", "sse", "stream"),
    "vocabulary": ("types", "errors", "validation", "cancel", "render", "cost"),
    "I/O": ("transport", "bridge", "clock", "frontend"),
}
#: which layers each layer may import: its own and every layer below it
MAY_IMPORT: dict[str, frozenset[str]] = {
    name: frozenset(list(LAYERS)[i:]) for i, name in enumerate(LAYERS)
}

#: functions of a package's ``__init__`` that are entry points (IPython calls them on %load_ext)
ENTRY_FUNCTIONS = frozenset({"load_ipython_extension", "unload_ipython_extension"})


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of ``importer`` on ``imported``."""

    importer: str
    imported: str
    path: Path
    line: int
    statement: str
    where: str  # "module level", "in function f", "under TYPE_CHECKING"

    def __str__(self) -> str:
        return (f"{self.path.as_posix()}:{self.line}: {self.statement}   "
                f"[{self.importer} -> {self.imported}, {self.where}]")


@dataclass
class Graph:
    package: str
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def is_core(self, module: str) -> bool:
        return not (self.is_notebook(module) or module == f"{self.package}.__main__")

    def is_notebook(self, module: str) -> bool:
        notebook = f"{self.package}.notebook"
        return module == notebook or module.startswith(notebook + ".")

    def core_to_notebook(self) -> list[Import]:
        """Rule (a)'s violations."""
        return [i for i in self.imports if self.is_core(i.importer) and self.is_notebook(i.imported)]

    def layer_of(self, module: str, layers: dict[str, tuple[str, ...]]) -> str | None:
        """The layer ``module`` belongs to (by its top-level module or package), if any."""
        parts = module.split(".")[1:]
        top = parts[0] if parts else "__init__"
        return next((name for name, members in layers.items() if top in members), None)

    def unplaced(self, layers: dict[str, tuple[str, ...]]) -> list[str]:
        """Rule (c)'s first half: modules in no layer."""
        return sorted(m for m in self.modules if self.layer_of(m, layers) is None)

    def upward(self, layers: dict[str, tuple[str, ...]]) -> list[tuple[Import, str, str]]:
        """Rule (c)'s violations: each import of a layer above the importer's, with both layers."""
        names = list(layers)
        found = []
        for i in self.imports:
            low, high = self.layer_of(i.importer, layers), self.layer_of(i.imported, layers)
            if low is not None and high is not None and names.index(high) < names.index(low):
                found.append((i, low, high))
        return found

    def core_cycles(self) -> list[list[str]]:
        """Rule (b)'s violations: the strongly connected groups of core modules (2 or more)."""
        edges: dict[str, set[str]] = {m: set() for m in self.modules if self.is_core(m)}
        for i in self.imports:
            if i.importer in edges and i.imported in edges and i.importer != i.imported:
                edges[i.importer].add(i.imported)
        return [sorted(group) for group in _strongly_connected(edges) if len(group) > 1]

    def describe_cycle(self, group: list[str]) -> str:
        """A cycle of ``group``, then every import line between its modules (each closes one)."""
        members = set(group)
        inside = sorted((i for i in self.imports if i.importer in members
                         and i.imported in members and i.importer != i.imported),
                        key=lambda i: (i.importer, i.line, i.imported))
        edges: dict[str, set[str]] = {m: set() for m in group}
        for i in inside:
            edges[i.importer].add(i.imported)
        path = _shortest_cycle(group[0], edges)
        return "\n".join([f"cycle {' -> '.join(path)}  (group: {', '.join(group)})",
                          *(f"    {i}" for i in inside)])


def module_name(path: Path, root: Path, package: str) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_graph(root: Path = ROOT, package: str | None = None) -> Graph:
    """Every import of every module under ``root`` (the package's folder)."""
    graph = Graph(package or root.name)
    for path in sorted(root.rglob("*.py")):
        graph.modules[module_name(path, root, graph.package)] = path
    base = root.parent
    for module, path in graph.modules.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        is_package = path.name == "__init__.py"
        for node, where in _imports(ast.parse(source, filename=str(path)), is_package):
            statement = " ".join(ln.strip() for ln in lines[node.lineno - 1 : node.end_lineno])
            for target in sorted(_targets(graph, module, node, is_package)):
                if target != module:
                    graph.imports.append(Import(module, target, path.relative_to(base),
                                                node.lineno, statement, where))
    return graph


def _imports(tree: ast.Module, is_package: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement, with where it is; not those of a package's entry functions."""

    def walk(node: ast.AST, where: str, top: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, where
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not (top and is_package and child.name in ENTRY_FUNCTIONS):
                    yield from walk(child, f"in function {child.name}", False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]),
                                    "under TYPE_CHECKING", top)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), where, top)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, where, False)
            else:
                yield from walk(child, where, top)

    yield from walk(tree, "module level", True)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(graph: Graph, module: str, node: ast.Import | ast.ImportFrom,
             is_package: bool) -> set[str]:
    """The package's modules this statement makes ``module`` depend on."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{alias.name}" for alias in node.names]
        submodules = [name for name in names if name in graph.modules]
        # ``from pkg import x`` runs pkg's __init__ first, and reads x from it unless x is a
        # module; a package the importer sits in has run before it (``from . import b``: b alone)
        if len(submodules) < len(names) or not module.startswith(prefix + "."):
            submodules.append(prefix)
        names = submodules
    found = set()
    for name in names:
        while name and name not in graph.modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _shortest_cycle(start: str, edges: dict[str, set[str]]) -> list[str]:
    """``start -> ... -> start`` through the fewest imports (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return [start]


def report(graph: Graph) -> tuple[str, str]:
    """The failure messages of rules (a) and (b): empty when the rule holds."""
    upward = graph.core_to_notebook()
    a = "" if not upward else (
        f"{len(upward)} import(s) of {graph.package}.notebook from the core (move what the core "
        "needs out of notebook/ into a core module, and re-export it there):\n"
        + "\n".join(f"    {i}" for i in upward))
    cycles = graph.core_cycles()
    b = "" if not cycles else (
        f"{len(cycles)} import cycle(s) among core modules; each import line listed closes one "
        "(break a cycle by moving what both sides need into a module of its own, or by passing "
        "it in):\n\n" + "\n\n".join(graph.describe_cycle(group) for group in cycles))
    return a, b


def layer_report(graph: Graph, layers: dict[str, tuple[str, ...]]) -> str:
    """Rule (c)'s failure message: empty when it holds."""
    problems = []
    unplaced = graph.unplaced(layers)
    if unplaced:
        problems.append(f"{len(unplaced)} module(s) in no layer (add each to its layer in LAYERS "
                        "and in the diagram of docs/architecture.md): " + ", ".join(unplaced))
    upward = graph.upward(layers)
    if upward:
        problems.append(
            f"{len(upward)} upward import(s) (a layer imports only its own and the layers below "
            "it: move what the lower module needs down into its layer, or pass it in):\n"
            + "\n".join(f"    {i}   ({low} -> {high})" for i, low, high in upward))
    return "\n\n".join(problems)


def diagram_layers(text: str) -> dict[str, tuple[str, ...]]:
    """The layer diagram of docs/architecture.md (the code block under "## The layers") as data:
    each row's name, then the ``name/`` and ``name.py`` entries outside parentheses."""
    section = text.split("## The layers", 1)[1]
    block = section.split("```", 2)[1]
    block = re.sub(r"\([^()]*\)", " ", block)  # descriptions, also across lines
    layers: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        if not line.strip() or set(line.strip()) <= {"─", "-"}:
            continue
        head = re.match(r"^ ?(\S+(?: \S+)*?)\s{2,}", line) if line[:2].strip() else None
        if head:  # a row starts at the margin with the layer's name; its other lines are indented
            current = head.group(1)
            layers[current] = []
            line = line[head.end():]
        assert current is not None, f"a diagram line before any layer name: {line!r}"
        for entry in re.findall(r"([\w]+)(/|\.py)", line):
            layers[current].append(entry[0])
    return {name: tuple(members) for name, members in layers.items()}


# -- the rules, on dispatch_nb ------------------------------------------------------------------------
def test_the_core_does_not_import_the_notebook() -> None:
    graph = read_graph()
    assert len(graph.modules) > 30 and graph.imports  # it read the package
    problems, _ = report(graph)
    assert not problems, problems


def test_no_layer_imports_a_layer_above_it() -> None:
    problems = layer_report(read_graph(), LAYERS)
    assert not problems, problems


def test_the_architecture_diagram_is_the_layers_the_test_enforces() -> None:
    drawn = diagram_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert list(drawn) == list(LAYERS), "the diagram's layers, top to bottom"
    for name, members in LAYERS.items():
        assert sorted(drawn[name]) == sorted(members), f"the {name} row of the diagram"


def test_no_import_cycle_among_core_modules() -> None:
    _, problems = report(read_graph())
    assert not problems, problems


# -- the checker itself, on a small package with every case ------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


SYNTHETIC = {
    "__init__.py": (
        "from typing import TYPE_CHECKING\n"
        "def load_ipython_extension(ipython):\n"
        "    from .notebook.magics import load\n"  # an entry point: allowed
        "def unload_ipython_extension(ipython):\n"
        "    from .notebook import magics\n"
        "if TYPE_CHECKING:\n"
        "    from .a import A\n"
    ),
    "__main__.py": "from pkg.notebook import magics\n",  # an entry point: allowed
    "a.py": "from . import b\nA = 1\n",
    "b.py": "import os\n\n\ndef later():\n    from .a import (\n        A,\n    )\n",  # closes a<->b
    "sub/__init__.py": "",
    "sub/c.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..notebook.magics import Magics\n"  # the core reaching up, for types only
        "from .. import d\n"
    ),
    "d.py": "class D:\n    def m(self):\n        import pkg.sub.c\n",  # closes sub.c <-> d
    "e.py": "from .a import A\nfrom . import A as again\n",  # depends on the cycle, not in it
    "notebook/__init__.py": "",
    "notebook/magics.py": "from ..a import A\nfrom ..sub import c\n",  # notebook -> core: fine
}


def test_the_checker_finds_each_cycle_and_each_upward_import(tmp_path: Path) -> None:
    graph = read_graph(_package(tmp_path, SYNTHETIC))
    assert set(graph.modules) == {"pkg", "pkg.__main__", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c",
                                  "pkg.d", "pkg.e", "pkg.notebook", "pkg.notebook.magics"}

    upward = graph.core_to_notebook()
    assert [(i.importer, i.imported, i.line, i.where) for i in upward] == [
        ("pkg.sub.c", "pkg.notebook.magics", 3, "under TYPE_CHECKING")]

    assert sorted(graph.core_cycles()) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub.c"]]
    # ``from . import b``: b, not the package a sits in; ``from . import A``: the package's __init__
    assert {i.imported for i in graph.imports if i.importer == "pkg.a"} == {"pkg.b"}
    assert {i.imported for i in graph.imports if i.importer == "pkg.e"} == {"pkg.a", "pkg"}

    a, b = report(graph)
    assert "1 import(s) of pkg.notebook from the core" in a
    assert "pkg/sub/c.py:3: from ..notebook.magics import Magics" in a
    assert "load_ipython_extension" not in a and "__main__" not in a
    assert "2 import cycle(s) among core modules" in b
    assert "cycle pkg.a -> pkg.b -> pkg.a" in b
    # the function-level import that closes it, joined onto one line, and where it sits
    assert "pkg/b.py:5: from .a import ( A, )   [pkg.b -> pkg.a, in function later]" in b
    assert "pkg/a.py:1: from . import b   [pkg.a -> pkg.b, module level]" in b
    assert "pkg/d.py:3: import pkg.sub.c   [pkg.d -> pkg.sub.c, in function m]" in b
    assert "pkg/sub/c.py:4: from .. import d   [pkg.sub.c -> pkg.d, module level]" in b
    assert "pkg.e" not in b and "TYPE_CHECKING" not in b  # pkg -> pkg.a is not a cycle


def test_the_checker_passes_a_clean_package(tmp_path: Path) -> None:
    clean = dict(SYNTHETIC)
    clean["b.py"] = "import os\n"
    clean["d.py"] = "class D:\n    pass\n"
    del clean["sub/c.py"]
    graph = read_graph(_package(tmp_path, clean))
    assert report(graph) == ("", "")
    # the entry points' imports of the notebook were read, and are the only ones allowed
    assert {(i.importer, i.imported) for i in graph.imports if graph.is_notebook(i.imported)} == {
        ("pkg.__main__", "pkg.notebook"), ("pkg.__main__", "pkg.notebook.magics")}


def test_an_entry_function_outside_the_package_init_is_not_exempt(tmp_path: Path) -> None:
    graph = read_graph(_package(tmp_path, {
        "__init__.py": "",
        "x.py": "def load_ipython_extension(ip):\n    from .notebook import magics\n",
        "notebook/__init__.py": "",
        "notebook/magics.py": "",
    }))
    assert [(i.importer, i.imported) for i in graph.core_to_notebook()] == [
        ("pkg.x", "pkg.notebook"), ("pkg.x", "pkg.notebook.magics")]


# -- the layer rule, on a small package ------------------------------------------------------------
SYNTHETIC_LAYERS = {"top": ("ui", "__init__"), "middle": ("calls",), "bottom": ("wire", "types")}
LAYERED = {
    "__init__.py": "from .ui import show\n",  # the top layer imports what it likes below
    "ui.py": "from .calls import call\ndef show():\n    pass\n",
    "calls.py": "from .wire import body\nfrom . import types\ndef call():\n    pass\n",
    "wire/__init__.py": "from .body import body\n",
    "wire/body.py": (
        "from typing import TYPE_CHECKING\n"
        "from ..types import T\n"  # same layer: fine
        "if TYPE_CHECKING:\n"
        "    from ..calls import call\n"  # upward, for types only
        "def body():\n"
        "    from .. import ui\n"  # upward, inside a function
        "    return ui\n"
    ),
    "types.py": "T = int\n",
}


def test_the_checker_finds_every_upward_import(tmp_path: Path) -> None:
    graph = read_graph(_package(tmp_path, LAYERED))
    assert graph.unplaced(SYNTHETIC_LAYERS) == []
    found = [(i.importer, i.imported, i.line, i.where, low, high)
             for i, low, high in graph.upward(SYNTHETIC_LAYERS)]
    assert found == [
        ("pkg.wire.body", "pkg.calls", 4, "under TYPE_CHECKING", "bottom", "middle"),
        ("pkg.wire.body", "pkg.ui", 6, "in function body", "bottom", "top"),
    ]
    problems = layer_report(graph, SYNTHETIC_LAYERS)
    assert "2 upward import(s)" in problems
    assert "pkg/wire/body.py:6: from .. import ui   [pkg.wire.body -> pkg.ui, in function body]" \
        "   (bottom -> top)" in problems


def test_the_checker_passes_a_layered_package_and_names_unplaced_modules(tmp_path: Path) -> None:
    clean = dict(LAYERED)
    clean["wire/body.py"] = "from ..types import T\n"
    clean["extra.py"] = ""
    graph = read_graph(_package(tmp_path, clean))
    assert graph.upward(SYNTHETIC_LAYERS) == []
    assert layer_report(graph, SYNTHETIC_LAYERS) == (
        "1 module(s) in no layer (add each to its layer in LAYERS and in the diagram of "
        "docs/architecture.md): pkg.extra")
    del clean["extra.py"]
    assert layer_report(read_graph(_package(tmp_path / "again", clean)), SYNTHETIC_LAYERS) == ""


def test_the_diagram_reader_reads_rows_not_descriptions() -> None:
    text = ("# A\n\n## The layers\n\n```\n top          ui.py (shows: not/this.py)   __init__.py\n"
            "              more/ (continued\n              over lines/ x.py)\n ──────\n"
            " I/O          calls.py\n```\n\n```\nother.py\n```\n")
    assert diagram_layers(text) == {"top": ("ui", "__init__", "more"), "I/O": ("calls",)}


if __name__ == "__main__":
    graph = read_graph()
    found = [text for text in (*report(graph), layer_report(graph, LAYERS)) if text]
    print("\n\n".join(found) or "the import graph keeps its three rules")
    sys.exit(1 if found else 0)
