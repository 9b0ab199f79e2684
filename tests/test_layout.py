"""The top-level packages import one another in one direction only: no cycle in the package-level import graph.

Every ``import`` and ``from ... import`` in every module of a package counts, at any depth (an import inside a
function is still a dependency), and so does a string that names a module of another package in full (what
``importlib.import_module`` or an entry point would load), except in the ``kernelsmith`` command's table of command
modules (``ks_inductor.cli._COMMAND_MODULES``), where every area's commands are mounted. The order that holds today, bottom up: kernel_cache (the
cache, and the plain types, settings and version every package reads), ks_inductor (compiler, optimizer, judge),
integrations (serving stacks), benchmarks (the repository's benchmark programs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernel_cache", "ks_inductor", "integrations", "benchmarks")
_MODULE_STRING = re.compile(rf"^({'|'.join(PACKAGES)})(\.\w+)+(:\w+)?$")


def imported_packages(source: str) -> set[str]:
    """The top-level packages among ``PACKAGES`` that ``source`` imports or names as a module."""
    found = set()
    tree = ast.parse(source)
    # The console script's table of command modules is where every area meets (the composition root): it may name
    # the integrations' commands, and a module that is not there only drops its commands. It is no import edge.
    mounts = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "_COMMAND_MODULES" for t in node.targets)
              for c in ast.walk(node.value)}
    for node in ast.walk(tree):
        if id(node) in mounts:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            names = [node.value]
        found.update(n.split(".")[0] for n in names if n.split(".")[0] in PACKAGES)
    return found


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """package -> {imported package: [the files that import it]}."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            for dep in imported_packages(f.read_text()) - {pkg}:
                graph[pkg].setdefault(dep, []).append(str(f.relative_to(root)))
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in graph.get(n, {}):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in graph:
        if n not in state and (found := visit(n)):
            return found
    return None


def test_top_level_packages_form_no_import_cycle() -> None:
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        why = "; ".join(f"{a} -> {b} in {', '.join(graph[a][b][:3])}" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"import cycle between packages: {' -> '.join(cycle)} ({why})")


def test_the_kernel_cache_imports_no_other_package() -> None:
    """The bottom of the graph: the cache and the plain types stand on their own."""
    assert package_graph()["kernel_cache"] == {}


def test_a_cycle_is_found(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "ks_inductor" / "a.py").write_text("from kernel_cache.store import KernelStore\n")
    (tmp_path / "kernel_cache" / "b.py").write_text("def f():\n    import ks_inductor\n")
    assert find_cycle(package_graph(tmp_path)) in (["kernel_cache", "ks_inductor", "kernel_cache"],
                                                    ["ks_inductor", "kernel_cache", "ks_inductor"])
    (tmp_path / "kernel_cache" / "b.py").write_text("MODULES = ('ks_inductor.cli',)\n")
    assert find_cycle(package_graph(tmp_path)) is not None
    (tmp_path / "kernel_cache" / "b.py").write_text('"""Used by ks_inductor.cli, which imports it."""\n')
    assert find_cycle(package_graph(tmp_path)) is None
