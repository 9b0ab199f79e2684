"""``kernelsmith evolve PROBLEM``: search for a faster verified kernel for one problem and store the winner (exit
code 0 when a verified kernel was stored, 1 when none was)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ks_inductor.cli.args import (
    EXIT_NOTHING,
    EXIT_OK,
    UsageError,
    add_backend_argument,
    add_db_argument,
    add_json_argument,
    add_search_arguments,
    command,
    positive_float,
    positive_int,
)
from ks_inductor.cli.output import err_console, out_console, print_json, require_file

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

LLM_TIMEOUT_S = 120.0


class DeprecatedMinutes(argparse.Action):
    """A flag that took minutes, kept for the command lines that still use it: converted to seconds into ``dest``,
    with one line on stderr."""

    def __init__(self, *args: Any, replacement: str = "--time-limit", **kwargs: Any) -> None:
        self.replacement = replacement
        kwargs.setdefault("type", positive_float)
        kwargs.setdefault("metavar", "MIN")
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seconds = float(values) * 60
        err_console().print(f"kernelsmith: {option_string} MIN is deprecated; use {self.replacement} SECONDS "
                            f"(taken as {self.replacement} {seconds:g})", soft_wrap=True)
        setattr(namespace, self.dest, seconds)


def register(sub: Any) -> None:
    p = command(sub, "evolve", "evolve a faster verified Triton kernel for a KernelBench problem")
    p.add_argument("problem", help="KernelBench-format problem file (Model, get_inputs, get_init_inputs)")
    add_backend_argument(p)
    add_search_arguments(p, per="problem")
    p.add_argument("--time", dest="time_minutes", action=DeprecatedMinutes, default=None, help=argparse.SUPPRESS)
    p.add_argument("--parallel", type=positive_int, default=None, metavar="N",
                   help="judgments in flight (default: 2 on a CPU, 4 on a GPU)")
    p.add_argument("--no-resume", action="store_true", help="start a new run even if an unfinished one exists")
    add_db_argument(p)
    p.add_argument("--mutator", choices=["embedded", "llm"], default=None,
                   help="embedded or llm (default: llm when an endpoint is given, else embedded)")
    p.add_argument("--llm-base-url", default=None, metavar="URL",
                   help="OpenAI-compatible endpoint (default $KERNELSMITH_LLM_BASE_URL)")
    p.add_argument("--llm-model", default=None, help="model name at the endpoint (default $KERNELSMITH_LLM_MODEL)")
    p.add_argument("--llm-api-key", default=None, metavar="KEY",
                   help="API key for the endpoint (default $KERNELSMITH_LLM_API_KEY); never stored")
    p.add_argument("--llm-concurrency", type=positive_int, default=None, metavar="N",
                   help="requests in flight (default $KERNELSMITH_LLM_CONCURRENCY, else 2)")
    p.add_argument("--llm-timeout", type=positive_float, default=LLM_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds per request (default {LLM_TIMEOUT_S:g})")
    p.add_argument("--llm-fallback", choices=["embedded", "none"], default="none",
                   help="what to do when the endpoint cannot be reached (default none: stop)")
    add_json_argument(p)
    p.set_defaults(func=run)


def time_limit_s(args: argparse.Namespace) -> float | None:
    """``--time-limit`` in seconds; the deprecated ``--time MIN`` (already converted) when only it was given."""
    if args.time_limit is not None:
        return args.time_limit
    return getattr(args, "time_minutes", None)


def run(args: argparse.Namespace) -> int:
    from kernel_cache.access import open_store
    from kernel_cache.errors import CacheError
    from kernel_cache.record import VERIFIED
    from ks_core.problem_record import ProblemError
    from ks_inductor.evolve import EvolveConfig, LLMConfig
    from ks_inductor.evolve.evolver import EvolveError, evolve_problem
    from ks_inductor.evolve.mutators.llm import LLMUnavailable
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem_tracing import load_problem

    require_file(args.problem, "problem file")
    try:
        problem = load_problem(args.problem)
    except ProblemError as e:
        raise UsageError(str(e)) from None
    llm = None
    wants_llm = args.mutator == "llm" or (args.mutator is None and (args.llm_base_url or args.llm_model))
    if wants_llm:
        llm = LLMConfig(base_url=args.llm_base_url, model=args.llm_model, api_key=args.llm_api_key,
                        concurrency=args.llm_concurrency, timeout_s=args.llm_timeout,
                        fallback="embedded" if args.llm_fallback == "embedded" else None)
    config = EvolveConfig(budget=args.budget, time_limit_s=time_limit_s(args),
                          islands=args.islands, backend=args.backend, llm=llm, seed=args.seed,
                          resume=not args.no_resume, parallel=args.parallel, settle_at=args.settle_at)
    try:
        store = open_store(args.db)
    except CacheError as e:
        raise UsageError(str(e)) from None
    try:
        # The progress bar goes to stderr: stdout is the summary's (or the JSON's) alone.
        summary = evolve_problem(problem, config, store, progress=not args.json)
    except (EvolveError, LLMUnavailable, BackendUnavailable) as e:
        raise UsageError(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json(summary.to_json())
    else:
        print_summary(out_console(), problem, summary)
    return EXIT_OK if summary.best is not None and summary.best.status == VERIFIED else EXIT_NOTHING


def print_summary(console: Console, problem: Problem, s: Any) -> None:
    t = Table(title=f"evolve {problem.name}", show_header=False)
    t.add_row("problem key", s.problem_key)
    t.add_row("family", str(s.family))
    reused = getattr(s, "reused", 0)
    # What this run judged, and the verdicts it took from the cache instead (earlier runs' judgments of the same
    # candidates): "accepted" counts among the judgments alone.
    t.add_row("judgments", f"{s.judged}" + (f" (and {reused} verdicts of earlier runs reused)" if reused else ""))
    t.add_row("accepted", f"{s.accepted} of {s.judged}")
    t.add_row("failed steps", str(s.failed_steps))
    t.add_row("wall time", f"{s.wall_s:.1f} s")
    t.add_row("stopped by", s.stop_reason)
    if s.note:
        t.add_row("note", s.note)
    if getattr(s, "why", ""):
        t.add_row("why no kernel", s.why)
    if s.timed:
        # Scores: speedup over the best baseline, per call and inside a CUDA graph (geometric mean) on GPUs.
        t.add_row("seed score", f"{s.seed_speedup:.3f}x" if s.seed_speedup else "-")
        t.add_row("best score", f"{s.best_speedup:.3f}x" if s.best_speedup else "-")
        if s.head_to_head:
            # The final choice among the leaders: the first leader's final score over each other's.
            t.add_row("head to head", ", ".join(f"first leader {v:.3f}x of {k}" for k, v in s.head_to_head.items()))
    if s.best is not None:
        b = s.best
        t.add_row("winner", f"kernel #{b.id} ({b.status}, {'timed' if b.timed else 'untimed: interpreter only'})")
        if b.median_ms:
            t.add_row("winner time", f"{b.median_ms:.4f} ms")
        if s.best_result is not None and s.best_result.roofline_fraction:
            t.add_row("roofline", f"{100 * s.best_result.roofline_fraction:.1f}% of the floor")
        if s.lineage:
            # The winner's line from its seed: each step's operator, and its gain where the judge timed both.
            t.add_row("winner's line", " → ".join(
                st["operator"] + (f" {st['gain']:.2f}x" if st.get("gain") else "") for st in s.lineage))
        if s.winning_move:
            t.add_row("winning move", f"{s.winning_move['operator']} ({s.winning_move['gain']:.2f}x over its parent)")
    else:
        t.add_row("winner", f"none ({s.why})" if s.why else "none (no correct candidate)")
    if s.room:
        from ks_inductor.judge.room import Room

        t.add_row("room", Room.from_json(s.room).summary())
    if s.tokens:
        t.add_row("LLM usage", ", ".join(f"{k} {v}" for k, v in s.tokens.items()))
    console.print(t)
