"""No module imports itself back: the module import graph of ks_core, kernel_cache, ks_inductor and integrations has
no cycle.

Every import counts, wherever it stands: at module level, inside a function (a dependency all the same, only
later), under ``if TYPE_CHECKING:`` (a type named back is a circle of the design), and a literal name given to
``importlib.import_module``. ``from package import name`` points at the module ``package.name`` where there is one,
else at ``package``; relative imports are resolved against the importing module. Each circle belongs to the
smallest package holding all its modules, and each package has a test of its own, so a failure names the package,
the circle and the lines that make it. Check it with ``python -m pytest tests/test_import_cycles.py``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ks_core", "kernel_cache", "ks_inductor", "integrations")
_IMPORT_FUNCTIONS = ("import_module", "__import__")


@dataclass
class ImportGraph:
    """module -> {imported module: where (path:line) the first import of it stands}."""

    modules: dict[str, Path]
    edges: dict[str, dict[str, str]] = field(default_factory=dict)

    def packages(self) -> list[str]:
        return sorted(m for m, p in self.modules.items() if p.name == "__init__.py")


def _module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    names = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join(parts)] = f
    return names


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` loads from this tree: itself, else the closest package above it; None outside it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, package: str, modules: dict[str, Path]) -> list[str | None]:
    if isinstance(node, ast.Import):
        return [_known(a.name, modules) for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[:len(anchor) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else _known(base, modules) for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if name in _IMPORT_FUNCTIONS and isinstance(node.args[0].value, str):
            return [_known(node.args[0].value, modules)]
    return []


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> ImportGraph:
    graph = ImportGraph(_module_names(root, packages))
    for module, path in graph.modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out = graph.edges.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, graph.modules):
                if target is not None and target != module:
                    where = f"{path.relative_to(root)}:{node.lineno}"  # type: ignore[attr-defined]
                    out[target] = min(out.get(target, where), where, key=lambda w: int(w.rpartition(":")[2]))
    return graph


def strongly_connected(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The graph's circles: every set of two or more modules that reach one another (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def one_circle(edges: dict[str, dict[str, str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, {})):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not a circle")


def owner(graph: ImportGraph, component: list[str]) -> str:
    """The smallest package holding every module of the component; "" where it spans top-level packages."""
    homes = [m if graph.modules[m].name == "__init__.py" else m.rpartition(".")[0] for m in component]
    common = homes[0].split(".")
    for home in homes[1:]:
        parts = home.split(".")
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common)


def circles_by_package(graph: ImportGraph) -> dict[str, list[str]]:
    """package -> one line per circle it holds: the modules in order, then the import that makes each step."""
    out: dict[str, list[str]] = {}
    for component in strongly_connected(graph.edges):
        path = one_circle(graph.edges, component)
        steps = ", ".join(f"{a} -> {b} at {graph.edges[a][b]}" for a, b in zip(path, path[1:]))
        out.setdefault(owner(graph, component), []).append(f"{' -> '.join(path)} ({steps}; "
                                                            f"{len(component)} modules in the circle)")
    return out


_GRAPH = import_graph()
_CIRCLES = circles_by_package(_GRAPH)


@pytest.mark.parametrize("package", _GRAPH.packages())
def test_no_import_cycle_inside_the_package(package: str) -> None:
    circles = _CIRCLES.get(package, [])
    assert not circles, f"import cycle inside {package}: " + "; ".join(circles)


def test_no_import_cycle_across_top_level_packages() -> None:
    circles = _CIRCLES.get("", [])
    assert not circles, "import cycle across packages: " + "; ".join(circles)


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    pkg = tmp_path / "kernel_cache"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from kernel_cache.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "sub" / "c.py").write_text("import importlib\nimportlib.import_module('kernel_cache.a')\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kernel_cache import e\n")
    (pkg / "e.py").write_text("from . import d\n")
    graph = import_graph(tmp_path, ("kernel_cache",))
    circles = circles_by_package(graph)
    assert list(circles) == ["kernel_cache"] and len(circles["kernel_cache"]) == 2
    first, second = sorted(circles["kernel_cache"])
    assert first.startswith("kernel_cache.a -> kernel_cache.sub.b -> kernel_cache.sub.c -> kernel_cache.a (")
    assert "kernel_cache.sub.b -> kernel_cache.sub.c at kernel_cache/sub/b.py:2" in first
    assert second.startswith("kernel_cache.d -> kernel_cache.e -> kernel_cache.d (")
    (pkg / "sub" / "c.py").write_text("import importlib\n")
    (pkg / "e.py").write_text("import json\n")
    assert circles_by_package(import_graph(tmp_path, ("kernel_cache",))) == {}


def test_a_circle_is_filed_under_the_smallest_package_holding_it(tmp_path: Path) -> None:
    for pkg in ("ks_inductor", "ks_inductor/x", "ks_inductor/y", "kernel_cache"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "ks_inductor" / "x" / "a.py").write_text("from ks_inductor.y import b\n")
    (tmp_path / "ks_inductor" / "y" / "b.py").write_text("import ks_inductor.x.a\n")
    (tmp_path / "kernel_cache" / "c.py").write_text("from ks_inductor import d\n")
    (tmp_path / "ks_inductor" / "d.py").write_text("from kernel_cache.c import f\n")
    circles = circles_by_package(import_graph(tmp_path, ("kernel_cache", "ks_inductor")))
    assert sorted(circles) == ["", "ks_inductor"]
