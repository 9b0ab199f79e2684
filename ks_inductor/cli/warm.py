"""``kernelsmith warm``: evolve a kernel for every region of a model, of KernelBench problems, or of the misses
compiles recorded (exit code 0 when every region has a verified kernel, 1 when some have none)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from kernel_cache.access import open_store
from ks_inductor.cli.args import (
    EXIT_NOTHING,
    EXIT_OK,
    UsageError,
    add_backend_argument,
    add_db_argument,
    add_json_argument,
    add_kernelbench_arguments,
    add_model_arguments,
    add_search_arguments,
    command,
    positive_float,
    positive_int,
)
from ks_inductor.cli.inputs import check_hf_flags, model_and_inputs
from ks_inductor.cli.output import err_console, out_console, print_json

SOURCES = "a model factory (module:function), a KernelBench file or folder, --hf-config, --kernelbench DIR or " \
          "--from-misses"


def register(sub: Any) -> None:
    from ks_inductor.warm.parallel import REGIONS_PER_GPU

    p = command(sub, "warm", "evolve kernels for every region of a model (or of KernelBench problems, or misses)")
    add_model_arguments(p, source="module:function or path/to/file.py:function returning (model, example_inputs), "
                                  "a KernelBench file (its Model and get_inputs()), or a folder of them")
    add_kernelbench_arguments(p)
    p.add_argument("--from-misses", action="store_true", help="the regions compiles recorded as misses")
    add_search_arguments(p, per="region")
    p.add_argument("--total-time", type=positive_float, default=None, metavar="SECONDS",
                   help="wall-time limit for the whole run, in seconds: each region gets at most what is left, "
                        "regions not reached are reported not-run (default: none)")
    p.add_argument("--force", action="store_true", help="evolve keys that already have a verified kernel too")
    p.add_argument("--parallel-regions", type=positive_int, default=None, metavar="N",
                   help=f"regions searched at once, sharing one judge over the local devices (default: "
                        f"{REGIONS_PER_GPU} per local GPU, 2 on a CPU)")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="search the regions on a Ray cluster, one worker per GPU (per CPU without GPUs): 'auto' "
                        "for the running cluster, 'local' to start one here for the run, or host:port "
                        "(default: no Ray, this host)")
    p.add_argument("--ray-results", choices=("auto", "db", "driver"), default="auto",
                   help="with --ray, who writes the results: the workers to the shared cache (db), or this "
                        "process (driver); auto: db for PostgreSQL or a one-host cluster, else driver (default auto)")
    add_db_argument(p)
    add_backend_argument(p)
    add_json_argument(p)
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> str | None:
    """The KernelBench folder to read, if that is the source; refuses sources given together."""
    check_hf_flags(args)
    folder = args.kernelbench or (args.source if args.source and os.path.isdir(args.source) else None)
    given = [name for name, on in (("a source", bool(args.source)),
                                   ("--hf-config", bool(args.hf_config)), ("--kernelbench", bool(args.kernelbench)),
                                   ("--from-misses", args.from_misses)) if on]
    if len(given) > 1:
        raise UsageError(f"give one of {' and '.join(given)}: each says where the regions come from")
    if (args.levels or args.problems) and not folder:
        raise UsageError(f"{'--levels' if args.levels else '--problems'} applies only with --kernelbench DIR")
    if not given:
        raise UsageError(f"give {SOURCES}")
    return folder


def run(args: argparse.Namespace) -> int:
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.judge.backends import BackendUnavailable
    from ks_inductor.warm import (
        WarmError,
        problems_from_folder,
        problems_from_misses,
        problems_from_model,
        warm,
    )
    from ks_inductor.warm.ray_cluster import RayExecutor, RayUnavailable

    started = time.monotonic()
    executor = None
    console = err_console()
    folder = _check(args)
    if not args.from_misses and not folder:
        # A bad factory or a model that cannot fit is reported before the cache is opened (and perhaps created).
        model, input_sets = model_and_inputs(args, SOURCES)
    store = open_store(args.db, create=True)
    try:
        if args.from_misses:
            problems, origin = problems_from_misses(store), "misses"
            if not problems:
                console.print("no recorded misses; compile with options={'kernelsmith.on_miss': 'record'} first")
        elif folder:
            with console.status("tracing the regions of the folder's models"):
                problems = problems_from_folder(folder, judge_backend=args.backend, levels=args.levels,
                                                ids=args.problems, store=store)
            origin = "kernelbench"
        else:
            with console.status("tracing the model's regions"):
                problems = [p for inputs in input_sets
                            for p in problems_from_model(model, inputs, judge_backend=args.backend, store=store)]
            origin = "model"
        console.print(f"{len({p.key for p in problems})} distinct regions to warm")
        config = EvolveConfig(budget=args.budget, time_limit_s=args.time_limit, islands=args.islands,
                              backend=args.backend, seed=args.seed, parallel_regions=args.parallel_regions,
                              settle_at=args.settle_at)
        # The whole-run limit counts from the command's start: tracing the model is part of the run.
        total = None if args.total_time is None else args.total_time - (time.monotonic() - started)
        if args.ray:
            executor = RayExecutor(args.ray, db=store.location, results=args.ray_results).connect()
        summary = warm(problems, store, config, force=args.force, console=console, origin=origin,
                       total_time_s=total, executor=executor)
    except (WarmError, BackendUnavailable, RayUnavailable) as e:
        raise UsageError(str(e)) from None
    finally:
        if executor is not None:
            executor.close()
        store.close()
    if args.json:
        print_json(summary.to_json())
    else:
        out_console().print(summary.table())
    # Like pack export: a region left without a kernel is a job that found nothing for it.
    return EXIT_OK if all(i.status in ("found", "skipped") for i in summary.items) else EXIT_NOTHING
