"""The ``kernelsmith`` command: a thin layer over the library. Each area mounts its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

log = logging.getLogger(__name__)

# Modules that contribute sub-commands through register(subparsers).
# The console script is where every area meets, so this table may name any package, the serving integrations (their
# installed name first, then the checkout's) included; a module that cannot be imported only drops its commands.
_COMMAND_MODULES = ("kernel_cache.cli", "ks_inductor.pack_cli", "ks_inductor.evolve.cli", "ks_inductor.warm.cli",
                    ("kernelsmith_integrations.pack_cli", "integrations.pack_cli"))


class UsageError(Exception):
    """A mistake in what the user typed or pointed at; ``main`` prints its message on one line and exits 2."""


# ------------------------------------------------------------------ arguments shared by the sub-commands
# Each flag that several commands take is declared here once, so that its name, unit and help are the same
# everywhere (``--db`` is kernel_cache.cli.add_db_argument, beside the store).

BACKEND_HELP = "judge backend (default: detect; triton-cuda or triton-maca on a GPU, triton-interpret on CPU)"


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _positive(int)
positive_float = _positive(float)


def add_backend_argument(p: argparse.ArgumentParser) -> None:
    from ks_inductor.judge.backends import BACKEND_NAMES

    p.add_argument("--backend", choices=list(BACKEND_NAMES), default=None, help=BACKEND_HELP)


def add_search_arguments(p: argparse.ArgumentParser, per: str, budget: int) -> None:
    """``--budget`` and ``--time-limit`` (both per ``per``: a problem, a region), ``--islands`` and ``--seed``."""
    p.add_argument("--budget", type=positive_int, default=budget, metavar="N",
                   help=f"candidates judged per {per} (default {budget})")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                   help=f"wall-time limit per {per}, in seconds (default: none)")
    p.add_argument("--islands", type=positive_int, default=2, metavar="N",
                   help="independent populations the search keeps (default 2)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")


def add_json_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


class DeprecatedMinutes(argparse.Action):
    """An old flag that took minutes: converted to seconds into ``dest``, with one line on stderr."""

    def __init__(self, *args: Any, replacement: str = "--time-limit", **kwargs: Any) -> None:
        self.replacement = replacement
        kwargs.setdefault("type", positive_float)
        kwargs.setdefault("metavar", "MIN")
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seconds = float(values) * 60
        print(f"kernelsmith: {option_string} MIN is deprecated; use {self.replacement} SECONDS "
              f"(taken as {self.replacement} {seconds:g})", file=sys.stderr)
        setattr(namespace, self.dest, seconds)


def _user_error(e: BaseException) -> bool:
    """Whether ``e`` is about the user's input (a file, a URL, a factory, a machine without the asked backend)
    rather than a fault of kernelsmith: those get one line and exit code 2, not a traceback."""
    from kernel_cache.errors import CacheError
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem import ProblemError
    from ks_inductor.warm import WarmError

    return isinstance(e, (UsageError, CacheError, BackendUnavailable, ProblemError, WarmError))


def _cmd_eval(args: argparse.Namespace) -> int:
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem import ProblemError, load_problem

    console = Console(stderr=args.json)
    if not os.path.isfile(args.candidate):
        raise UsageError(f"candidate file not found: {args.candidate}")
    config = JudgeConfig(backend=args.backend, trials=args.trials)
    try:
        # One judgment: one device (and one warm worker parent) is all it uses. Started first, so that the parent's
        # imports overlap the problem's tracing.
        judge = Judge(config, devices=[0], spares=False)
    except BackendUnavailable as e:
        raise UsageError(str(e)) from None
    with judge:
        try:
            problem = load_problem(args.problem)
        except ProblemError as e:
            raise UsageError(str(e)) from None
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
    if result.stage_s:
        console.print(stage_table(result.stage_s, result.duration_s))
    console.print(result.feedback_text())


def stage_table(stage_s: dict[str, float], total_s: float, title: str | None = None) -> Table:
    """Where a judgment's time went, stage by stage, largest first."""
    t = Table("stage", "s", "%", title=title or f"judgment time {total_s:.2f} s")
    for name, sec in sorted(stage_s.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{sec:.3f}", f"{100 * sec / total_s:.0f}" if total_s > 0 else "-")
    return t


# ``kernelsmith bench`` and ``kernelsmith report`` run the repository's benchmark programs, which are not part of
# the installed package: benchmarks/ of a kernelsmith checkout, with the arguments as given.
_BENCH_PROGRAMS = {
    "bench": ("run", "time kernelsmith against eager, Inductor and Liger on the GPU (python -m benchmarks.run)"),
    "report": ("report", "regenerate the markdown table and plots of a benchmark result (python -m benchmarks.report)"),
}


def benchmarks_root(configured: str | None = None) -> Path | None:
    """The checkout whose ``benchmarks/`` the bench commands run: ``configured`` (``KERNELSMITH_BENCHMARKS``), else
    the current directory, else the source tree this package was loaded from."""
    import ks_inductor

    for root in (configured, os.getcwd(), Path(ks_inductor.__file__).resolve().parent.parent):
        if root and (Path(root) / "benchmarks" / "run.py").is_file():
            return Path(root).resolve()
    return None


def _register_benchmarks(sub: Any) -> None:
    for name, (program, helptext) in _BENCH_PROGRAMS.items():
        # No options of its own: every argument, --help included, goes to the benchmark program.
        p = sub.add_parser(name, help=helptext, add_help=False, prefix_chars="\0")
        p.add_argument("argv", nargs="*", help=f"arguments of python -m benchmarks.{program}")
        p.set_defaults(func=_cmd_benchmarks, program=program)


def _cmd_benchmarks(args: argparse.Namespace) -> int:
    import subprocess

    from kernel_cache.settings import Settings

    root = benchmarks_root(Settings.from_env().benchmarks)
    if root is None:
        raise UsageError("the benchmarks are not installed with kernelsmith: run this command in a kernelsmith "
                         "checkout, or set KERNELSMITH_BENCHMARKS to one")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
    return subprocess.call([sys.executable, "-m", f"benchmarks.{args.program}", *args.argv], env=env)


def _first_importable(names: tuple[str, ...]) -> Any:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            log.debug("sub-commands from %s unavailable: %s", name, e)
    return None


def build_parser() -> argparse.ArgumentParser:
    from ks_inductor import __version__

    parser = argparse.ArgumentParser(prog="kernelsmith", description="Evolve, verify, cache and serve Triton kernels")
    parser.add_argument("--version", action="version", version=f"kernelsmith {__version__}",
                        help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("eval", help="judge a candidate kernel against a KernelBench-format problem")
    p.add_argument("problem", help="KernelBench-format problem file (Model, get_inputs, get_init_inputs)")
    p.add_argument("candidate", help="candidate file: Triton kernels and a ModelNew with the problem's interface")
    add_backend_argument(p)
    p.add_argument("--trials", type=positive_int, default=5, metavar="N",
                   help="timing trials per variant (default 5)")
    add_json_argument(p)
    p.set_defaults(func=_cmd_eval)
    for names in _COMMAND_MODULES:
        mod = _first_importable((names,) if isinstance(names, str) else names)
        if mod is not None:
            mod.register(sub)
    _register_benchmarks(sub)
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
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130
    except Exception as e:
        if not _user_error(e):
            raise
        if getattr(args, "json", False):
            print(json.dumps({"correct": False, "stage": "usage", "flags": ["usage_error"], "error": str(e)}))
        Console(stderr=True).print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the sub-commands raise ks_inductor.cli.UsageError,
    # which this copy's except clauses would not recognise.
    from ks_inductor.cli import main as _main

    sys.exit(_main())
