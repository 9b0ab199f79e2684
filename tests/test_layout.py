"""The top-level packages import one another in one direction only: no cycle in the package-level import graph.

Every ``import`` and ``from ... import`` in every module of a package counts, at any depth (an import inside a
function is still a dependency), and so does a string that names a module of another package in full (what
``importlib.import_module`` or an entry point would load). The integrations count under their installed name
(``kernelsmith_integrations``) too. The ``kernelsmith`` command (``ks_inductor/cli/``) is a node of its own, on
top: it may import every package, and none imports it. The layers, bottom up: ks_core (the foundation: settings,
version, fingerprints, the plain problem record), kernel_cache (the cache), ks_inductor (compiler, optimizer,
judge), integrations (serving stacks), the command, benchmarks (the repository's benchmark programs). A package
imports only the layers below it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = "ks_inductor.cli"
# Bottom up: each imports only those before it.
PACKAGES = ("ks_core", "kernel_cache", "ks_inductor", "integrations", CLI, "benchmarks")
# Installed names of packages whose folder is named otherwise.
_INSTALLED = {"kernelsmith_integrations": "integrations"}
_MODULE_STRING = re.compile(r"^(ks_core|kernel_cache|ks_inductor|integrations|kernelsmith_integrations|benchmarks)"
                            r"(\.\w+)+(:\w+)?$")


def node_of(module: str) -> str | None:
    """The graph node a module name belongs to (one of ``PACKAGES``), or None for a module outside them."""
    if module == CLI or module.startswith(CLI + "."):
        return CLI
    top = module.split(".")[0]
    top = _INSTALLED.get(top, top)
    return top if top in PACKAGES else None


def imported_packages(source: str) -> set[str]:
    """The nodes among ``PACKAGES`` that ``source`` imports or names as a module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            # "from ks_inductor import cli" names the command's package as well
            names += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" == CLI]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            names = [node.value.split(":")[0]]
        found.update(n for n in map(node_of, names) if n is not None)
    return found


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """node -> {imported node: [the files that import it]}."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for f in sorted(f for pkg in PACKAGES if "." not in pkg for f in (root / pkg).rglob("*.py")):
        rel = f.relative_to(root)
        pkg = node_of(".".join(rel.with_suffix("").parts))
        for dep in imported_packages(f.read_text()) - {pkg}:
            graph[pkg].setdefault(dep, []).append(str(rel))
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


def arrows_up(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every import of a layer above the importer (``PACKAGES`` is bottom up), with the files that make it."""
    rank = {p: i for i, p in enumerate(PACKAGES)}
    return [f"{pkg} -> {dep} in {', '.join(files[:3])}" for pkg, deps in graph.items() for dep, files in deps.items()
            if rank[dep] > rank[pkg]]


def test_no_package_imports_a_layer_above_it() -> None:
    up = arrows_up(package_graph())
    assert not up, "imports of a higher layer: " + "; ".join(up)


def test_the_foundation_imports_no_other_package() -> None:
    """The bottom of the graph: settings, version, fingerprints and the plain problem record stand on their own."""
    assert package_graph()["ks_core"] == {}


def test_the_cache_stands_on_the_foundation_alone() -> None:
    assert set(package_graph()["kernel_cache"]) <= {"ks_core"}


def test_the_command_is_on_top() -> None:
    """The command may import every package; no package imports it (only the benchmark programs, above it)."""
    graph = package_graph()
    assert {"ks_core", "kernel_cache", "ks_inductor", "integrations"} <= set(graph[CLI])
    importers = {pkg: files for pkg, deps in graph.items() for dep, files in deps.items() if dep == CLI}
    assert set(importers) <= {"benchmarks"}, importers


def test_a_cycle_is_found(tmp_path: Path) -> None:
    for pkg in ("ks_core", "kernel_cache", "ks_inductor/cli", "integrations", "benchmarks"):
        (tmp_path / pkg).mkdir(parents=True)
    (tmp_path / "ks_inductor" / "a.py").write_text("from kernel_cache.store import KernelStore\n")
    (tmp_path / "kernel_cache" / "b.py").write_text("def f():\n    import ks_inductor\n")
    assert find_cycle(package_graph(tmp_path)) in (["kernel_cache", "ks_inductor", "kernel_cache"],
                                                    ["ks_inductor", "kernel_cache", "ks_inductor"])
    (tmp_path / "kernel_cache" / "b.py").write_text("MODULES = ('ks_inductor.compiler',)\n")
    assert find_cycle(package_graph(tmp_path)) is not None
    (tmp_path / "kernel_cache" / "b.py").write_text('"""Used by ks_inductor.compiler, which imports it."""\n')
    assert find_cycle(package_graph(tmp_path)) is None
    # The command imports the integrations under their installed name; an integration importing it back is a cycle.
    (tmp_path / "ks_inductor" / "cli" / "pack.py").write_text("from kernelsmith_integrations.ops import x\n")
    (tmp_path / "integrations" / "ops.py").write_text("def f():\n    from ks_inductor import cli\n")
    assert find_cycle(package_graph(tmp_path)) in (["ks_inductor.cli", "integrations", "ks_inductor.cli"],
                                                    ["integrations", "ks_inductor.cli", "integrations"])


def test_an_arrow_up_is_found(tmp_path: Path) -> None:
    for pkg in ("ks_core", "kernel_cache", "ks_inductor/cli", "integrations", "benchmarks"):
        (tmp_path / pkg).mkdir(parents=True)
    (tmp_path / "kernel_cache" / "a.py").write_text("from ks_core.settings import Settings\n")
    assert arrows_up(package_graph(tmp_path)) == []
    (tmp_path / "ks_core" / "b.py").write_text("def f():\n    from kernel_cache.store import KernelStore\n")
    assert arrows_up(package_graph(tmp_path)) == ["ks_core -> kernel_cache in ks_core/b.py"]


def imports_of_tests(source: str) -> set[str]:
    """The modules of the test suite (``tests.*``) that ``source`` imports, or has ``importlib`` import."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found.update(n for n in names if n == "tests" or n.startswith("tests."))
    return found


def test_nothing_outside_the_tests_imports_them() -> None:
    """The library and the benchmarks take shared problems from ks_inductor.catalogue, not from the test suite."""
    found = {str(f.relative_to(ROOT)): sorted(imports_of_tests(f.read_text()))
             for pkg in ("ks_core", "kernel_cache", "ks_inductor", "integrations", "benchmarks")
             for f in sorted((ROOT / pkg).rglob("*.py"))}
    assert not {f: m for f, m in found.items() if m}


def test_no_test_module_imports_another() -> None:
    """A test module imports the catalogue for problems and the suite's helper modules (fixtures, fakes), never
    another test module: each one runs, and reads, on its own."""
    found = {}
    for f in sorted((ROOT / "tests").glob("*.py")):
        tests = sorted(m for m in imports_of_tests(f.read_text()) if re.match(r"tests\.test_", m))
        if tests:
            found[f.name] = tests
    assert not found


def test_an_import_of_the_tests_is_found() -> None:
    src = ("from tests.test_a import X\nimport tests.speed\nfrom tests import conftest\n"
           "importlib.import_module('tests.test_b')\nfrom testsuite import y\n")
    assert imports_of_tests(src) == {"tests.test_a", "tests.test_a.X", "tests.speed", "tests", "tests.conftest",
                                     "tests.test_b"}
