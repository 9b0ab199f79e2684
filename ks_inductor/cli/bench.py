"""``kernelsmith bench``: the repository's benchmark runner (``python -m benchmarks.run``), with every argument
passed on. The benchmarks are not installed with the package: they run from a kernelsmith checkout (the current
directory, the source tree, or ``$KERNELSMITH_BENCHMARKS``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ks_inductor.cli.args import UsageError


def benchmarks_root(configured: str | None = None) -> Path | None:
    """The checkout whose ``benchmarks/`` the bench commands run: ``configured`` (``KERNELSMITH_BENCHMARKS``), else
    the current directory, else the source tree this package was loaded from."""
    import ks_inductor

    for root in (configured, os.getcwd(), Path(ks_inductor.__file__).resolve().parent.parent):
        if root and (Path(root) / "benchmarks" / "run.py").is_file():
            return Path(root).resolve()
    return None


def register_program(sub: Any, name: str, program: str, helptext: str) -> None:
    """A command that hands every argument, ``--help`` included, to ``python -m benchmarks.PROGRAM``."""
    p = sub.add_parser(name, help=helptext, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help=f"arguments of python -m benchmarks.{program}")
    p.set_defaults(func=run_program, program=program, prog=f"kernelsmith {name}")


def register(sub: Any) -> None:
    register_program(sub, "bench", "run",
                     "time kernelsmith against eager, Inductor and Liger on the GPU (python -m benchmarks.run)")


def run_program(args: argparse.Namespace) -> int:
    from ks_core.settings import Settings

    root = benchmarks_root(Settings.from_env().benchmarks)
    if root is None:
        raise UsageError("the benchmarks are not installed with kernelsmith: run this command in a kernelsmith "
                         "checkout, or set KERNELSMITH_BENCHMARKS to one")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    # -v before the command reaches the program as well as -v after it.
    argv = [*args.argv, *["-v"] * args.verbose]
    # The program's main is called with this command's name, so that its help and messages say how it was run.
    code = (f"import sys; from benchmarks.{args.program} import main; "
            f"sys.exit(main(sys.argv[1:], prog={args.prog!r}))")
    return subprocess.call([sys.executable, "-c", code, *argv], env=env)
