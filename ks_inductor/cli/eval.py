"""``kernelsmith eval PROBLEM CANDIDATE``: judge one candidate kernel (exit code 0 accepted, 1 rejected)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from ks_inductor.cli.args import (
    EXIT_NOTHING,
    EXIT_OK,
    UsageError,
    add_backend_argument,
    add_json_argument,
    command,
    positive_int,
)
from ks_inductor.cli.output import err_console, out_console, require_file

TRIALS = 5


def register(sub: Any) -> None:
    p = command(sub, "eval", "judge a candidate kernel against a KernelBench-format problem")
    p.add_argument("problem", help="KernelBench-format problem file (Model, get_inputs, get_init_inputs)")
    p.add_argument("candidate", help="candidate file: Triton kernels and a ModelNew with the problem's interface")
    add_backend_argument(p)
    p.add_argument("--trials", type=positive_int, default=TRIALS, metavar="N",
                   help=f"timing trials per variant (default {TRIALS})")
    add_json_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ks_core.problem_record import ProblemError
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem_tracing import load_problem

    require_file(args.problem, "problem file")
    require_file(args.candidate, "candidate file")
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
        with err_console().status(f"judging {os.path.basename(args.candidate)} on {judge.backend.name}"):
            with open(args.candidate) as fh:
                result = judge.evaluate(problem, fh.read())
    if args.json:
        print(result.dumps())
    else:
        print_result(out_console(), result)
    return EXIT_OK if result.accepted else EXIT_NOTHING


def print_result(console: Console, result: Any) -> None:
    colour = {"accepted": "green", "quarantined": "yellow"}.get(result.verdict, "red")
    console.print(f"[bold {colour}]{result.verdict}[/] (stage {result.stage}, backend {result.backend})")
    for r in result.reasons:
        console.print(f"  - {r}", markup=False)
    if result.timings:
        t = Table("variant", "median ms", "IQR ms", "n")
        for name, tm in result.timings.items():
            t.add_row(name, f"{tm.median_ms:.4f}", f"{tm.iqr_ms:.4f}", str(tm.n))
        console.print(t)
    if result.stage_s:
        console.print(stage_table(result.stage_s, result.duration_s))
    console.print(result.feedback_text(), markup=False)


def stage_table(stage_s: dict[str, float], total_s: float, title: str | None = None) -> Table:
    """Where a judgment's time went, stage by stage, largest first."""
    t = Table("stage", "s", "%", title=title or f"judgment time {total_s:.2f} s")
    for name, sec in sorted(stage_s.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{sec:.3f}", f"{100 * sec / total_s:.0f}" if total_s > 0 else "-")
    return t
