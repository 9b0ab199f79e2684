"""The ``kernelsmith`` command is a package on top of the library: one module per command over shared arguments,
reachable as the console script and as ``python -m ks_inductor.cli``, and imported by no module of the library."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

import ks_inductor
from ks_inductor.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
CLI_DIR = ROOT / "ks_inductor" / "cli"
LIBRARY = ("kernel_cache", "ks_inductor", "integrations")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth, relative imports resolved against its own package."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def test_nothing_in_the_library_imports_the_command():
    offenders = []
    for pkg in LIBRARY:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if CLI_DIR in f.parents:
                continue
            hits = sorted(m for m in _imports(f) if m == "ks_inductor.cli" or m.startswith("ks_inductor.cli."))
            if hits:
                offenders.append(f"{f.relative_to(ROOT)}: {', '.join(hits)}")
    assert not offenders, "the library imports the command: " + "; ".join(offenders)


def test_the_walk_sees_relative_imports(tmp_path):
    f = ROOT / "ks_inductor" / "warm" / "run.py"
    assert "ks_inductor.warm.region" in _imports(f)
    assert {"ks_inductor.cli.args", "ks_inductor.cli.args.UsageError"} <= _imports(CLI_DIR / "main.py")


def test_the_command_modules_of_earlier_layouts_are_gone():
    for old in ("ks_inductor/cli.py", "ks_inductor/pack_cli.py", "ks_inductor/evolve/cli.py", "ks_inductor/warm/cli.py",
                "kernel_cache/cli.py", "integrations/pack_cli.py"):
        assert not (ROOT / old).exists(), old


def test_one_module_per_command():
    from ks_inductor.cli.main import COMMANDS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {}
    for module in COMMANDS:
        own = argparse.ArgumentParser().add_subparsers()
        module.register(own)
        registered[module.__name__.rsplit(".", 1)[1]] = list(own.choices)
    assert registered == {"eval": ["eval"], "evolve": ["evolve"], "warm": ["warm"], "explain": ["explain"],
                          "cache": ["cache"], "pack": ["pack"], "trajectories": ["export-trajectories"],
                          "bench": ["bench"], "report": ["report"]}
    assert list(sub.choices) == [c for names in registered.values() for c in names]
    shared = {"__init__", "__main__", "main", "args", "output", "inputs"}
    assert {p.stem for p in CLI_DIR.glob("*.py")} - shared == set(registered)


def test_console_script_and_python_m_reach_the_same_main():
    setup = (ROOT / "setup.py").read_text()
    assert '"kernelsmith = ks_inductor.cli:main"' in setup
    from ks_inductor import cli

    assert cli.main is main
    out = subprocess.run([sys.executable, "-m", "ks_inductor.cli", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"kernelsmith {ks_inductor.__version__}", out.stderr


def test_the_suite_never_writes_the_users_home():
    """Every test process has a kernelsmith home of its own (conftest), so no test leaves a cache or analyses in
    the user's ~/.cache/kernelsmith."""
    from ks_core.settings import Settings

    users = Path(os.path.expanduser("~")) / ".cache" / "kernelsmith"
    home = Settings.from_env().cache_home()
    assert home != users and users not in home.parents
    assert home.name.startswith("home-") and home.parent.name.startswith("ks-test-") and home.is_dir()
