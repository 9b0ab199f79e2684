"""``kernelsmith explain``: a model's regions, their keys, and what a compile here would do with each (it reads the
cache and changes nothing)."""

from __future__ import annotations

import argparse
from typing import Any

from kernel_cache.access import open_store
from ks_inductor.cli.args import (
    EXIT_OK,
    UsageError,
    add_backend_argument,
    add_db_argument,
    add_json_argument,
    add_model_arguments,
    command,
)
from ks_inductor.cli.inputs import model_and_inputs
from ks_inductor.cli.output import missing_cache, out_console, print_json

SOURCES = "a model factory (module:function), a KernelBench file or --hf-config"


def register(sub: Any) -> None:
    p = command(sub, "explain", "table of a model's regions: key, operations, whether a compile here would use a "
                                "cached kernel, speedup")
    add_model_arguments(p, source="module:function or path/to/file.py:function returning (model, example_inputs), "
                                  "or a KernelBench file (its Model and get_inputs())")
    add_db_argument(p)
    add_backend_argument(p)
    add_json_argument(p)
    p.set_defaults(func=run)


def _check_cache(args: argparse.Namespace) -> None:
    """A cache the user named must be there; the default one may not be yet (every region is then a miss)."""
    from kernel_cache.errors import CacheError, NoDatabaseError

    try:
        open_store(args.db, create=False).close()
    except NoDatabaseError as e:
        missing_cache(args, e)
    except CacheError as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from ks_inductor.compiler.explain import Explanation, explain

    model, input_sets = model_and_inputs(args, SOURCES)
    _check_cache(args)
    parts = [explain(model, *inputs, db=args.db, judge_backend=args.backend) for inputs in input_sets]
    result = parts[0]
    if len(parts) > 1:
        # Every shape's graphs in one report; a region key met at several shapes is one problem.
        problems = {p.key: p for part in parts for p in part.problems}
        result = Explanation(graphs=[g for part in parts for g in part.graphs], problems=list(problems.values()),
                             no_cache=parts[0].no_cache)
    if args.json:
        print_json(result.to_json())
    else:
        console = out_console()
        console.print(result.table())
        console.print(f"{result.hits} hits, {result.misses} misses")
    return EXIT_OK
