"""The ``kernelsmith`` command: a thin layer over the library. Each area mounts its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

log = logging.getLogger(__name__)

# Modules that contribute sub-commands through register(subparsers).
_COMMAND_MODULES = ("kernel_cache.cli", "ks_inductor.evolve.cli", "ks_inductor.warm_cli", "benchmarks.cli")


class UsageError(Exception):
    pass


def _cmd_eval(args: argparse.Namespace) -> int:
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem import ProblemError, load_problem

    console = Console(stderr=args.json)
    if not os.path.isfile(args.candidate):
        raise UsageError(f"candidate file not found: {args.candidate}")
    try:
        problem = load_problem(args.problem)
    except ProblemError as e:
        raise UsageError(str(e)) from None
    config = JudgeConfig(backend=args.backend, trials=args.trials)
    try:
        judge = Judge(config, spares=False)
    except BackendUnavailable as e:
        raise UsageError(str(e)) from None
    with judge:
        with console.status(f"judging {os.path.basename(args.candidate)} on {judge.backend.name}"):
            result = judge.evaluate(problem, open(args.candidate).read())
    if args.json:
        print(result.dumps())
    else:
        _print_result(console, result)
    return 0 if result.accepted else 1


def _print_result(console: Console, result: Any) -> None:
    colour = {"accepted": "green", "quarantined": "yellow"}.get(result.verdict, "red")
    console.print(f"[bold {colour}]{result.verdict}[/] (stage {result.stage}, backend {result.backend})")
    for r in result.reasons:
        console.print(f"  - {r}")
    if result.timings:
        t = Table("variant", "median ms", "IQR ms", "n")
        for name, tm in result.timings.items():
            t.add_row(name, f"{tm.median_ms:.4f}", f"{tm.iqr_ms:.4f}", str(tm.n))
        console.print(t)
    console.print(result.feedback_text())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelsmith", description="Evolve, verify, cache and serve Triton kernels")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("eval", help="judge a candidate kernel against a KernelBench-format problem")
    p.add_argument("problem")
    p.add_argument("candidate")
    p.add_argument("--backend", choices=["triton-cuda", "triton-maca", "triton-interpret"], default=None)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_eval)
    for name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            log.debug("sub-commands from %s unavailable: %s", name, e)
            continue
        mod.register(sub)
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        if getattr(args, "json", False):
            print(json.dumps({"correct": False, "stage": "usage", "flags": ["usage_error"], "error": str(e)}))
        Console(stderr=True).print(f"[red]error:[/] {e}")
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
