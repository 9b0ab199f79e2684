"""``kernelsmith export-trajectories``: the correctness-preserving, high-gain evolution steps as training data, each
row naming its move, the parent's and child's measurements, the hardware that timed it and the judge's verdict; a
dataset card beside the rows; what was kept and why every other step was dropped, by move and device."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from kernel_cache.access import open_store
from ks_inductor.cli.args import (
    EXIT_OK,
    UsageError,
    add_db_argument,
    add_json_argument,
    add_key_argument,
    command,
    nonnegative_float,
)
from ks_inductor.cli.output import err_console, match_keys, print_json, result_console

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
    p.add_argument("-o", "--output", required=True, metavar="FILE.jsonl",
                   help="where to write the rows (required); the dataset card goes beside it as FILE.card.md")
    add_json_argument(p)
    p.set_defaults(func=run)


def _command_line(args: argparse.Namespace, where: str) -> str:
    """The command as the card records it: every filter explicit, the cache as displayed (no password)."""
    argv = ["kernelsmith", "export-trajectories", "--format", args.format, "--db", where,
            "--min-gain", f"{args.min_gain:g}", "--max-noise", f"{args.max_noise:g}"]
    for k in args.keys or []:
        argv += ["--key", k]
    return shlex.join(argv + ["-o", args.output])


def run(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from ks_inductor.training import export_trajectories, reason_label

    try:
        # Reads only: a missing cache is reported, not created.
        store = open_store(args.db, create=False)
    except CacheError as e:
        raise UsageError(str(e)) from None
    try:
        stats = export_trajectories(store, args.format, args.output, args.min_gain, args.max_noise,
                                    match_keys(store, args.keys), command=_command_line(args, store.where))
    finally:
        store.close()
    if args.json:
        print_json({"ok": True, **stats.to_json()})
    con = result_console(args)
    con.print(f"wrote {stats.rows} {args.format} rows to {stats.output} and the card to {stats.card} "
              f"(from {stats.steps} steps; dropped: {stats.drop_summary()})", markup=False)
    for name, op in sorted(stats.operators.items(), key=lambda kv: (-kv[1].steps, kv[0])):
        why = ", ".join(f"{n} {reason_label(r)}" for r, n in sorted(op.dropped.items(), key=lambda kv: -kv[1]))
        con.print(f"  {name}: {op.steps} steps, {op.kept} kept" + (f"; dropped {why}" if why else ""), markup=False)
    summary = stats.operator_summary()
    if summary:
        err_console().print(f"steps by operator: {summary}", markup=False)
    return EXIT_OK
