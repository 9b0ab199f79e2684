"""``kernelsmith export-trajectories``: the correctness-preserving, high-gain evolution steps as training data, each
row naming its operator, parent, child and gain; the steps of every operator counted on stderr."""

from __future__ import annotations

import argparse
from typing import Any

from kernel_cache.access import open_store
from ks_inductor.cli.args import (
    EXIT_OK,
    UsageError,
    add_db_argument,
    add_key_argument,
    command,
    nonnegative_float,
)
from ks_inductor.cli.output import err_console, match_keys

MIN_GAIN = 0.05
MAX_NOISE = 0.05


def register(sub: Any) -> None:
    p = command(sub, "export-trajectories", "write correctness-preserving, high-gain evolution steps as training data")
    p.add_argument("--format", choices=["sft", "rl"], default="sft",
                   help="sft: chat messages; rl: prompt, reference and parent code (default sft)")
    add_db_argument(p)
    p.add_argument("--min-gain", type=nonnegative_float, default=MIN_GAIN, metavar="G",
                   help=f"keep a step when the child's speedup lower bound >= parent speedup x (1 + G) (default "
                        f"{MIN_GAIN:g})")
    p.add_argument("--max-noise", type=nonnegative_float, default=MAX_NOISE, metavar="R",
                   help=f"largest IQR/median of the child's timing (default {MAX_NOISE:g})")
    add_key_argument(p, "steps")
    p.add_argument("-o", "--output", required=True, metavar="FILE.jsonl", help="where to write the rows (required)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from ks_inductor.training import export_trajectories

    try:
        # Reads only: a missing cache is reported, not created.
        store = open_store(args.db, create=False)
    except CacheError as e:
        raise UsageError(str(e)) from None
    try:
        stats = export_trajectories(store, args.format, args.output, args.min_gain, args.max_noise,
                                    match_keys(store, args.keys))
    finally:
        store.close()
    err_console().print(f"wrote {stats.rows} {args.format} rows to {args.output} "
                        f"(from {stats.steps} steps; dropped: {stats.dropped_incorrect} incorrect or not revisions, "
                        f"{stats.dropped_untimed} untimed, {stats.dropped_gain} below the gain, "
                        f"{stats.dropped_noise} too noisy)", markup=False)
    summary = stats.operator_summary()
    if summary:
        err_console().print(f"steps by operator: {summary}", markup=False)
    return EXIT_OK
