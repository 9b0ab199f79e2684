"""``kernelsmith bench`` and ``kernelsmith report``: the benchmark runner and the report, as sub-commands."""

from __future__ import annotations

import argparse
from typing import Any


def _bench(args: argparse.Namespace) -> int:
    import sys

    from benchmarks.run import handle

    # Recorded in the result as the command that reproduces it.
    return handle(args, sys.argv[1:], prog="kernelsmith")


def _report(args: argparse.Namespace) -> int:
    from benchmarks.report import handle

    return handle(args)


def register(subparsers: Any) -> None:
    from pathlib import Path

    from benchmarks.config import SUITES
    from benchmarks.run import add_arguments

    p = subparsers.add_parser("bench", help="time kernelsmith against eager, Inductor and Liger on the GPU",
                              description=f"Run a benchmark suite ({', '.join(SUITES)}) and write "
                                          "JSON, markdown and plots under benchmarks/results/")
    add_arguments(p)
    p.set_defaults(func=_bench)
    r = subparsers.add_parser("report", help="regenerate the markdown table and plots of a benchmark result")
    r.add_argument("result", type=Path, help="a result JSON written by kernelsmith bench")
    r.add_argument("--no-plots", action="store_true", help="write the markdown table only")
    r.set_defaults(func=_report)
