"""The GPU benchmark runner.

    python -m benchmarks.run --suite llm-ops [--out FILE] [--db URL] [--budget N] [--resume]
    python -m benchmarks.run --suite kernelbench --kernelbench ~/KernelBench --levels 1,2 [--problems 1,19]

Times eager, Inductor (default and max-autotune-no-cudagraphs), Liger-Kernel where it has the op, and
kernelsmith's cached kernel in one process with the judge's timing protocol, after checking each one's output
against the problem's own reference (or, for bf16/fp16 problems, the same model run in fp32). Writes ``benchmarks/results/<suite>-<device>-<date>.json`` (after every workload, so
an interrupted run keeps what it measured; ``--resume`` continues it), then the markdown table and the plots
next to it.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from rich.console import Console

from benchmarks.config import SUITES, BenchUsageError, RunConfig
from benchmarks.measure import Protocol
from benchmarks.results import RunResult, default_result_path, load_result, now_iso
from ks_inductor.cli.args import (
    HelpFormatter,
    add_db_argument,
    add_kernelbench_arguments,
    add_verbose_argument,
    csv_of,
    dtype_name,
    hidden_alias,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)
from ks_inductor.cli.output import err_console, out_console

log = logging.getLogger(__name__)


def _csv(kind: type = str):  # noqa: ANN202 - argparse type factory
    def parse(text: str) -> list:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") \
                from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The runner's flags; those the ``kernelsmith`` commands also take are theirs (ks_inductor.cli.args), with the
    same spelling, meaning, unit and default."""
    p.add_argument("--suite", required=True, choices=SUITES, help="which benchmark suite to run")
    p.add_argument("--out", type=Path, help="result JSON (default benchmarks/results/<suite>-<device>-<date>.json)")
    add_db_argument(p)
    p.add_argument("--backend", default=None, choices=["triton-cuda", "triton-maca", "triton-interpret"],
                   help="judge backend for cache lookups and --budget (default: detect)")
    p.add_argument("--budget", dest="evolve_budget", type=positive_int, default=0, metavar="N",
                   help="on a cache miss, evolve the problem with N judged candidates first, then look again "
                        "(default: look up only)")
    p.add_argument("--no-kernelsmith", action="store_true", help="time the peers only")
    p.add_argument("--peers", type=_csv(), default=None,
                   help="peers to time (eager always is): eager,inductor,inductor-max-autotune,liger,F.rms_norm "
                        "(default: all)")
    p.add_argument("--ops", type=_csv(), default=None, help="llm-ops: subset of ops (default: all)")
    p.add_argument("--dtype", dest="dtypes", type=dtype_name, action="append", default=None, metavar="DTYPE",
                   help="llm-ops: a dtype of the workloads: bf16, fp16 or a torch name such as bfloat16 "
                        "(repeatable; default: all)")
    hidden_alias(p, "--dtypes", dest="dtypes", type=csv_of(dtype_name))
    p.add_argument("--phases", type=_csv(), default=None, help="llm-ops: prefill,decode (default: both)")
    add_kernelbench_arguments(p)
    p.add_argument("--limit", type=positive_int, default=None, help="kernelbench: at most N problems (default: all)")
    # The judge's final protocol (benchmarks.measure.Protocol) is the default of every timing flag.
    d = Protocol()
    p.add_argument("--rounds", type=positive_int, default=d.rounds,
                   help=f"interleaved timing rounds (default {d.rounds})")
    p.add_argument("--rep-ms", type=positive_float, default=d.rep_ms,
                   help=f"timed milliseconds per tool, all rounds (default {d.rep_ms:g})")
    p.add_argument("--warmup-ms", type=nonnegative_float, default=d.warmup_ms,
                   help=f"warm-up milliseconds per tool (default {d.warmup_ms:g})")
    p.add_argument("--rotating-sets", type=positive_int, default=d.rotating_sets,
                   help=f"input sets cycled through while timing (default {d.rotating_sets})")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="random seed of the inputs and weights (default 0)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in --out and run the rest")
    p.add_argument("--no-plots", action="store_true", help="write JSON and markdown only")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cuda (default); cpu only checks the runner, with --smoke")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes and a few timed calls: checks the runner works, measures nothing")
    p.add_argument("--export-problems", type=Path, default=None, metavar="DIR",
                   help="llm-ops: write the selected workloads as problem files to DIR (for kernelsmith evolve) "
                        "and exit (default: run them)")
    add_verbose_argument(p)


def config_from_args(args: argparse.Namespace, argv: list[str] | None = None,
                     prog: str = "python -m benchmarks.run") -> RunConfig:
    if args.smoke:
        protocol = Protocol.smoke()
        protocol.seed = args.seed
    else:
        protocol = Protocol(rounds=args.rounds, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                            rotating_sets=args.rotating_sets, seed=args.seed)
    cfg = RunConfig(
        suite=args.suite, device=args.device, out=args.out, db=args.db, backend=args.backend,
        evolve_budget=args.evolve_budget, kernelsmith=not args.no_kernelsmith, peers=args.peers, ops=args.ops,
        dtypes=args.dtypes, phases=args.phases, smoke=args.smoke, protocol=protocol,
        kernelbench=Path(args.kernelbench) if args.kernelbench else None,
        levels=args.levels, problem_ids=args.problems, limit=args.limit, resume=args.resume,
        plots=not args.no_plots,
        command=prog + " " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])))
    cfg.validate()
    return cfg


def _check_device(cfg: RunConfig) -> None:
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchUsageError("no CUDA device visible; run this on the GPU machine (or --device cpu --smoke "
                                  "to exercise the runner)")
    elif cfg.device == "cpu":
        import os

        # Cached kernels and candidates run on the Triton interpreter on a CPU.
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _suite_dtypes(cfg: RunConfig) -> list[str]:
    if cfg.suite == "llm-ops":
        from benchmarks.suites.llm_ops import matmul_dtypes

        return matmul_dtypes(cfg)
    if cfg.suite == "kernelbench":
        return ["float32", "bfloat16"]
    return ["bfloat16"]


def run_suite(cfg: RunConfig, console: Console | None = None) -> tuple[RunResult, Path]:
    """Run one suite; returns the result and the path of its JSON (markdown and plots are written beside it)."""
    from benchmarks.env import collect_env
    from benchmarks.kernelsmith_peer import KernelSource
    from benchmarks.roofline import Ceilings, measure_ceilings
    from benchmarks.suites import SuiteContext, kernelbench, llm_ops

    console = console or err_console()
    suites = {"llm-ops": llm_ops, "kernelbench": kernelbench}
    suites[cfg.suite].plan(cfg)  # bad filters and missing inputs fail here, before a file or a store is touched
    _check_device(cfg)
    env = collect_env(cfg.device)
    out = Path(cfg.out) if cfg.out else default_result_path(cfg.suite, env.get("device_name", cfg.device))
    result: RunResult | None = None
    if cfg.resume and out.exists():
        try:
            result = load_result(out)
        except ValueError as e:
            raise BenchUsageError(f"--resume: {e}") from None
        if result.suite != cfg.suite:
            raise BenchUsageError(f"--resume: {out} holds suite {result.suite!r}, not {cfg.suite!r}")
        if result.env.get("device_name") != env.get("device_name"):
            raise BenchUsageError(f"--resume: {out} was measured on {result.env.get('device_name')}, this is "
                                  f"{env.get('device_name')}; use another --out")
        console.print(f"resuming {out}: {len(result.workloads)} rows kept")
    if result is None:
        result = RunResult(suite=cfg.suite, created=now_iso(), command=cfg.command, env=env,
                           protocol=cfg.protocol.to_json(), smoke=cfg.smoke or cfg.device == "cpu")
        with console.status("measuring copy bandwidth and matmul peak"):
            result.ceilings = measure_ceilings(cfg.device, _suite_dtypes(cfg)).to_json()
    else:
        result.env.setdefault("resumed", []).append({"at": now_iso(), "command": cfg.command})
    result.protocol["inductor_max_autotune_mode"] = "max-autotune-no-cudagraphs"
    kernels = KernelSource(cfg.db, cfg.evolve_budget, cfg.backend) if cfg.kernelsmith else None
    ctx = SuiteContext(cfg=cfg, result=result, ceilings=Ceilings.from_json(result.ceilings), kernels=kernels,
                       save=lambda: result.save(out), progress=lambda line: console.print(line))
    try:
        suites[cfg.suite].run(ctx)
    finally:
        if kernels is not None:
            kernels.close()
        if result.workloads:
            result.save(out)
    from benchmarks.report import write_report

    written = write_report(result, out, plots=cfg.plots)
    for p in written:
        console.print(f"wrote {p}")
    return result, out


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.run") -> int:
    """``prog``: the command line the help and the result file name this program by (``kernelsmith bench``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return handle(args, argv, prog)


def handle(args: argparse.Namespace, argv: list[str] | None = None, prog: str = "python -m benchmarks.run") -> int:
    from ks_inductor.cli.args import UsageError
    from ks_inductor.cli.output import check_db_folder

    console = err_console()
    try:
        check_db_folder(args)
        if getattr(args, "export_problems", None):
            from benchmarks.workloads import FULL, SMOKE, export_problems, llm_ops_workloads

            ws = llm_ops_workloads(args.ops, args.dtypes, args.phases, SMOKE if args.smoke else FULL)
            for p in export_problems(ws, args.export_problems):
                console.print(str(p))
            return 0
        cfg = config_from_args(args, argv, prog)
        result, out = run_suite(cfg, console)
    except (BenchUsageError, FileNotFoundError, UsageError) as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    from benchmarks.report import render_table

    # The result's table, on stdout: never cut where stdout is a pipe or a file.
    out_console().print(render_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
