"""``kernelsmith evolve`` and ``kernelsmith export-trajectories``: thin layers over the library."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table


def register(subparsers: Any) -> None:
    from kernel_cache.cli import add_db_argument
    from ks_inductor.cli import (
        DeprecatedMinutes,
        add_backend_argument,
        add_json_argument,
        add_search_arguments,
    )

    p = subparsers.add_parser("evolve", help="evolve a faster verified Triton kernel for a KernelBench problem")
    p.add_argument("problem", help="KernelBench-format problem file (Model, get_inputs, get_init_inputs)")
    add_backend_argument(p)
    add_search_arguments(p, per="problem", budget=64)
    p.add_argument("--time", dest="time_minutes", action=DeprecatedMinutes, default=None, help=argparse.SUPPRESS)
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="judgments in flight (default 2 on CPU, 4 on a GPU)")
    p.add_argument("--no-resume", action="store_true", help="start a new run even if an unfinished one exists")
    add_db_argument(p)
    p.add_argument("--mutator", choices=["embedded", "llm"], default=None,
                   help="embedded (default without an endpoint) or llm")
    p.add_argument("--llm-base-url", default=None, metavar="URL",
                   help="OpenAI-compatible endpoint (default $KERNELSMITH_LLM_BASE_URL)")
    p.add_argument("--llm-model", default=None, help="model name at the endpoint (default $KERNELSMITH_LLM_MODEL)")
    p.add_argument("--llm-api-key", default=None, metavar="KEY",
                   help="API key for the endpoint (default $KERNELSMITH_LLM_API_KEY); never stored")
    p.add_argument("--llm-concurrency", type=int, default=None, metavar="N",
                   help="requests in flight (default $KERNELSMITH_LLM_CONCURRENCY, else 2)")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="seconds per request (default 120)")
    p.add_argument("--llm-fallback", choices=["embedded", "none"], default="none",
                   help="what to do when the endpoint cannot be reached")
    add_json_argument(p)
    p.set_defaults(func=cmd_evolve)

    e = subparsers.add_parser("export-trajectories",
                              help="write correctness-preserving, high-gain evolution steps as training data")
    e.add_argument("--format", choices=["sft", "rl"], default="sft",
                   help="sft: chat messages; rl: prompt, reference and parent code (default sft)")
    add_db_argument(e)
    e.add_argument("--min-gain", type=float, default=0.05, metavar="G",
                   help="keep a step when the child's speedup lower bound >= parent speedup x (1 + G)")
    e.add_argument("--max-noise", type=float, default=0.05, help="largest IQR/median of the child's timing")
    e.add_argument("--problem-key", default=None, metavar="KEY", help="only steps of this problem key")
    e.add_argument("-o", "--output", required=True, metavar="FILE.jsonl", help="where to write the rows")
    e.set_defaults(func=cmd_export)


def _usage_error(msg: str) -> Exception:
    from ks_inductor.cli import UsageError

    return UsageError(msg)


def time_limit_s(args: argparse.Namespace) -> float | None:
    """``--time-limit`` in seconds; the deprecated ``--time MIN`` (already converted) when only it was given."""
    if args.time_limit is not None:
        return args.time_limit
    return getattr(args, "time_minutes", None)


def cmd_evolve(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig, LLMConfig
    from ks_inductor.evolve.evolver import EvolveError, evolve_problem
    from ks_inductor.evolve.mutators.llm import LLMUnavailable
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.problem import ProblemError, load_problem

    console = Console(stderr=args.json)
    try:
        problem = load_problem(args.problem)
    except ProblemError as e:
        raise _usage_error(str(e)) from None
    llm = None
    wants_llm = args.mutator == "llm" or (args.mutator is None and (args.llm_base_url or args.llm_model))
    if wants_llm:
        llm = LLMConfig(base_url=args.llm_base_url, model=args.llm_model, api_key=args.llm_api_key,
                        concurrency=args.llm_concurrency, timeout_s=args.llm_timeout,
                        fallback="embedded" if args.llm_fallback == "embedded" else None)
    config = EvolveConfig(budget=args.budget, time_limit_s=time_limit_s(args),
                          islands=args.islands, backend=args.backend, llm=llm, seed=args.seed,
                          resume=not args.no_resume, parallel=args.parallel)
    try:
        store = KernelStore(args.db)
    except CacheError as e:
        raise _usage_error(str(e)) from None
    try:
        summary = evolve_problem(problem, config, store, progress=not args.json)
    except (EvolveError, LLMUnavailable, BackendUnavailable) as e:
        raise _usage_error(str(e)) from None
    finally:
        store.close()
    if args.json:
        print(json.dumps(summary.to_json()))
    else:
        _print_summary(console, problem, summary)
    return 0 if summary.best is not None else 1


def _print_summary(console: Console, problem: Any, s: Any) -> None:
    t = Table(title=f"evolve {problem.name}", show_header=False)
    t.add_row("problem key", s.problem_key)
    t.add_row("family", str(s.family))
    t.add_row("judgments", str(s.judged))
    t.add_row("accepted", str(s.accepted))
    t.add_row("failed steps", str(s.failed_steps))
    t.add_row("wall time", f"{s.wall_s:.1f} s")
    t.add_row("stopped by", s.stop_reason)
    if s.note:
        t.add_row("note", s.note)
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
    else:
        t.add_row("winner", "none (no correct candidate)")
    if s.tokens:
        t.add_row("LLM usage", ", ".join(f"{k} {v}" for k, v in s.tokens.items()))
    console.print(t)


def cmd_export(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from kernel_cache.store import KernelStore
    from ks_inductor.training import export_trajectories

    console = Console(stderr=True)
    if args.min_gain < 0:
        raise _usage_error("--min-gain must be >= 0")
    try:
        # Reads only: a missing cache is reported, not created.
        store = KernelStore(args.db, create=False)
    except CacheError as e:
        raise _usage_error(str(e)) from None
    try:
        stats = export_trajectories(store, args.format, args.output, args.min_gain, args.max_noise,
                                    args.problem_key)
    finally:
        store.close()
    console.print(f"wrote {stats.rows} {args.format} rows to {args.output} "
                  f"(from {stats.steps} steps; dropped: {stats.dropped_incorrect} incorrect or not revisions, "
                  f"{stats.dropped_untimed} untimed, {stats.dropped_gain} below the gain, "
                  f"{stats.dropped_noise} too noisy)")
    return 0
