"""``kernelsmith warm`` and ``kernelsmith explain``: thin command-line layers over :mod:`ks_inductor.warm` and
:mod:`ks_inductor.compiler.explain`."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any


def _add_model_source(p: argparse.ArgumentParser) -> None:
    from kernel_cache.cli import add_db_argument
    from ks_inductor.cli import add_backend_argument, add_json_argument

    p.add_argument("source", nargs="?", help="module:function or path/to/file.py:function returning "
                   "(model, example_inputs), or a KernelBench file (its Model and get_inputs()); for warm also a "
                   "KernelBench folder")
    p.add_argument("--hf-config", metavar="CONFIG", help="a transformers config.json, or a model type such as "
                   "'llama' (random weights, nothing downloaded)")
    p.add_argument("--hf-set", metavar="KEY=VALUE", action="append", default=[],
                   help="override a config field, e.g. --hf-set hidden_size=64 (repeatable)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the example input ids (HF)")
    p.add_argument("--seq", type=int, default=16, help="sequence length of the example input ids (HF)")
    p.add_argument("--dtype", default=None, help="model dtype for HF configs: bf16, fp16, fp32 or a torch dtype "
                   "name (default bf16 on GPU, fp32 on CPU)")
    p.add_argument("--device", default=None, help="device for HF configs (default cuda when available)")
    add_db_argument(p)
    add_backend_argument(p)
    add_json_argument(p)


def register(subparsers: Any) -> None:
    from ks_inductor.cli import add_search_arguments, positive_float, positive_int

    w = subparsers.add_parser("warm", help="evolve kernels for every region of a model (or a folder, or misses)")
    _add_model_source(w)
    w.add_argument("--kernelbench", metavar="DIR", help="a folder of KernelBench problem files")
    w.add_argument("--from-misses", action="store_true", help="the regions compiles recorded as misses")
    add_search_arguments(w, per="region", budget=32)
    w.add_argument("--total-time", type=positive_float, default=None, metavar="SECONDS",
                   help="wall-time limit for the whole run, in seconds: each region gets at most what is left, "
                        "regions not reached are reported not-run (default: none)")
    w.add_argument("--force", action="store_true", help="evolve keys that already have a verified kernel too")
    w.add_argument("--parallel-regions", type=positive_int, default=None, metavar="N",
                   help="regions searched at once, sharing one judge over the local devices (default: one per "
                        "local GPU, 2 on the CPU)")
    w.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="search the regions on a Ray cluster, one worker per GPU (per CPU without GPUs): 'auto' "
                        "for the running cluster, 'local' to start one here for the run, or host:port")
    w.add_argument("--ray-results", choices=("auto", "db", "driver"), default="auto",
                   help="with --ray, who writes the results: the workers to the shared cache (db), or this "
                        "process (driver); auto: db for PostgreSQL or a one-host cluster, else driver")
    w.set_defaults(func=_cmd_warm)

    e = subparsers.add_parser("explain", help="table of a model's regions: key, operations, whether a compile here "
                                              "would use a cached kernel, speedup")
    _add_model_source(e)
    e.set_defaults(func=_cmd_explain)


def _usage(msg: str) -> Exception:
    from ks_inductor.cli import UsageError

    return UsageError(msg)


def _model_and_inputs(args: argparse.Namespace) -> tuple[Any, tuple]:
    from ks_inductor.warm import WarmError, hf_model, load_factory, parse_overrides

    try:
        if args.hf_config:
            return hf_model(args.hf_config, parse_overrides(args.hf_set), args.batch, args.seq, args.dtype,
                            args.device)
        if args.source:
            return load_factory(args.source)
    except WarmError as e:
        raise _usage(str(e)) from None
    raise _usage("give a model factory (module:function), --hf-config, --kernelbench DIR or --from-misses")


def _open_store(url: str | None) -> Any:
    from kernel_cache.errors import CacheError
    from kernel_cache.store import KernelStore

    try:
        return KernelStore(url)
    except CacheError as e:
        raise _usage(str(e)) from None


def _cmd_warm(args: argparse.Namespace) -> int:
    from rich.console import Console

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
    console = Console(stderr=True)
    folder = args.kernelbench or (args.source if args.source and os.path.isdir(args.source) else None)
    if not args.from_misses and not folder:
        # A bad factory is reported before the cache is opened (and perhaps created).
        model, inputs = _model_and_inputs(args)
    store = _open_store(args.db)
    try:
        if args.from_misses:
            problems, origin = problems_from_misses(store), "misses"
            if not problems:
                console.print("no recorded misses; compile with options={'kernelsmith.on_miss': 'record'} first")
        elif folder:
            with console.status("tracing the regions of the folder's models"):
                problems = problems_from_folder(folder, db=args.db, judge_backend=args.backend)
            origin = "kernelbench"
        else:
            with console.status("tracing the model's regions"):
                problems = problems_from_model(model, inputs, db=args.db, judge_backend=args.backend)
            origin = "model"
        console.print(f"{len({p.key for p in problems})} distinct regions to warm")
        config = EvolveConfig(budget=args.budget, time_limit_s=args.time_limit, islands=args.islands,
                              backend=args.backend, seed=args.seed, parallel_regions=args.parallel_regions)
        # The whole-run limit counts from the command's start: tracing the model is part of the run.
        total = None if args.total_time is None else args.total_time - (time.monotonic() - started)
        if args.ray:
            executor = RayExecutor(args.ray, db_url=store.url, results=args.ray_results).connect()
        summary = warm(problems, store, config, force=args.force, console=console, origin=origin,
                       total_time_s=total, executor=executor)
    except (WarmError, BackendUnavailable, RayUnavailable) as e:
        raise _usage(str(e)) from None
    finally:
        if executor is not None:
            executor.close()
        store.close()
    if args.json:
        print(json.dumps(summary.to_json()))
    else:
        Console().print(summary.table())
    return 0 if all(i.status != "failed" for i in summary.items) else 1


def _cmd_explain(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ks_inductor.compiler.explain import explain

    model, inputs = _model_and_inputs(args)
    result = explain(model, *inputs, db=args.db, judge_backend=args.backend)
    if result.no_cache:
        # Nothing was created; the regions are still worth listing (they are what warm would evolve).
        Console(stderr=True).print(f"no kernel cache at {result.no_cache}: every region is a miss",
                                   highlight=False, soft_wrap=True)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        console = Console()
        console.print(result.table())
        console.print(f"{result.hits} hits, {result.misses} misses")
    return 0
