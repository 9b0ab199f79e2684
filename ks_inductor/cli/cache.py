"""``kernelsmith cache ls|show|rm|gc|stats``: look into and maintain the kernel cache. Only what deletes writes, and
nothing here creates a cache."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from rich.table import Table

from kernel_cache.access import open_store
from kernel_cache.record import STATUSES
from ks_inductor.cli.args import (
    EXIT_OK,
    add_db_argument,
    add_json_argument,
    add_key_argument,
    command,
    positive_int,
)
from ks_inductor.cli.output import (
    cache_error_code,
    fail,
    fmt_number,
    fmt_speedup,
    fmt_when,
    missing_cache,
    out_console,
    print_json,
)

LIMIT = 100
KEEP = 3


def register(sub: Any) -> None:
    cache = command(sub, "cache", "list, inspect and maintain the kernel cache")
    actions = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    p = command(actions, "ls", "list kernels")
    add_db_argument(p)
    add_json_argument(p)
    add_key_argument(p, "kernels")
    p.add_argument("--status", choices=STATUSES, default=None, help="only kernels with this status (default: all)")
    p.add_argument("--family", default=None, help="only this op family (default: all)")
    p.add_argument("--limit", type=positive_int, default=LIMIT, metavar="N",
                   help=f"show at most N kernels (default {LIMIT})")
    p.set_defaults(func=_ls)

    p = command(actions, "show", "show one kernel, with its source as stored")
    add_db_argument(p)
    add_json_argument(p)
    p.add_argument("id", type=positive_int, help="kernel id (from cache ls)")
    p.add_argument("--no-source", action="store_true", help="leave the kernel's source out")
    p.set_defaults(func=_show)

    p = command(actions, "rm", "delete kernels by id")
    add_db_argument(p)
    add_json_argument(p)
    p.add_argument("ids", type=positive_int, nargs="+", metavar="ID", help="kernel ids (from cache ls)")
    p.set_defaults(func=_rm)

    p = command(actions, "gc", "drop rejected kernels and all but the best few verified per key and fingerprint")
    add_db_argument(p)
    add_json_argument(p)
    p.add_argument("--keep", type=positive_int, default=KEEP, metavar="N",
                   help=f"verified kernels kept per key and fingerprint, at least 1 (default {KEEP}; `cache rm` "
                        "deletes by id)")
    p.add_argument("--keep-rejected", action="store_true", help="keep rejected kernels")
    p.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    p.add_argument("--vacuum", action="store_true", help="compact the SQLite file afterwards")
    p.add_argument("--forget-guard", action="store_true",
                   help="also forget the graph guard's stored decisions (each graph is timed again when compiled)")
    p.set_defaults(func=_gc)

    p = command(actions, "stats", "counts and size of the cache")
    add_db_argument(p)
    add_json_argument(p)
    p.set_defaults(func=_stats)


def _speedup(r: Any) -> float | None:
    from kernel_cache.migrations import rank_of

    return rank_of(r.speedup_lcb, r.speedup_inductor, r.speedup_eager)


def kernel_table(records: list[Any], title: str | None = None) -> Table:
    t = Table("id", "problem key", "family", "device", "status", "speedup", "median ms", "sha256", "created",
              title=title)
    colour = {"verified": "green", "quarantined": "yellow", "rejected": "red"}
    for r in records:
        fp = r.fingerprint
        t.add_row(str(r.id), r.problem_key[:16], r.op_family or "-",
                  f"{fp.get('device_name', '?')} ({fp.get('backend', '?')})",
                  f"[{colour.get(r.status, 'white')}]{r.status}[/]", fmt_speedup(_speedup(r)),
                  fmt_number(r.median_ms, ".4f"), r.sha256[:12], fmt_when(r.created_at))
    return t


def _ls(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError, NoDatabaseError

    try:
        with open_store(args.db, create=False) as store:
            records = store.kernels(status=args.status, op_family=args.family)
    except NoDatabaseError as e:
        missing_cache(args, e)
        records = []
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.keys:
        records = [r for r in records if any(r.problem_key.startswith(k) for k in args.keys)]
    shown = records[: args.limit]
    if args.json:
        print_json([{**{k: v for k, v in r.to_json().items() if k not in ("source", "plan")},
                     "judged_plan": bool(r.plan)} for r in shown])
        return EXIT_OK
    c = out_console()
    if not records:
        c.print("no kernels match")
        return EXIT_OK
    c.print(kernel_table(shown))
    if len(records) > len(shown):
        c.print(f"{len(records) - len(shown)} more; use --limit")
    return EXIT_OK


def _plan_summary(plan: str) -> str:
    """A judged plan in a few words: its launches and kernels, or that the kernel serves from its forward."""
    from ks_inductor.judge.plan import Plan, PlanError

    if not plan:
        return "none: it serves from its forward"
    try:
        p = Plan.from_json(plan)
    except PlanError as e:
        return f"unreadable: {e}"
    return (f"judged plan: {p.launches()} launch(es) of {', '.join(sorted(p.kernel_names())) or 'nothing'}, "
            f"{len(p.steps)} step(s)")


def _show(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError

    try:
        # Nothing to show in a cache that is not there, named or not: NoDatabaseError is a usage error here.
        with open_store(args.db, create=False) as store:
            r = store.get_kernel(args.id)
            problem = store.get_problem(r.problem_key)
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        d = r.to_json()
        if args.no_source:
            d.pop("source")
        print_json(d)
        return EXIT_OK
    c = out_console()
    t = Table("field", "value", show_header=False)
    for k, v in r.to_json().items():
        if k in ("source", "fingerprint"):
            continue
        if k == "plan":  # the JSON is for machines (--json); a person is told what it launches
            t.add_row(k, _plan_summary(r.plan))
            continue
        t.add_row(k, fmt_when(v) if k == "created_at" else str(v))
    t.add_row("fingerprint", json.dumps(r.fingerprint))
    if problem is not None:
        t.add_row("problem", f"{problem.name}: {problem.signature()}")
    c.print(t)
    if args.no_source:
        return EXIT_OK
    if sys.stdout.isatty():
        from rich.syntax import Syntax

        c.print(Syntax(r.source, "python", line_numbers=True))
    else:
        # Piped or redirected: the source exactly as stored, so that what lands in a file runs.
        sys.stdout.write("\n" + r.source + ("" if r.source.endswith("\n") else "\n"))
    return EXIT_OK


def _rm(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError

    try:
        with open_store(args.db, create=False) as store:
            for i in args.ids:
                store.get_kernel(i)  # refuse the whole command on an unknown id
            n = store.delete_kernels(args.ids)
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json({"deleted": n})
    else:
        out_console().print(f"deleted {n} kernel(s)")
    return EXIT_OK


def _gc(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError, NoDatabaseError

    try:
        with open_store(args.db, create=False) as store:
            doomed = store.gc_plan(keep=args.keep, drop_rejected=not args.keep_rejected)
            forgotten = 0
            if not args.dry_run:
                store.delete_kernels([r.id for r in doomed if r.id is not None])
                if args.forget_guard:
                    forgotten = store.clear_guard_decisions()
                if args.vacuum:
                    store.vacuum()
    except NoDatabaseError as e:
        missing_cache(args, e)
        doomed, forgotten = [], 0
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json({"dry_run": args.dry_run, "deleted": [r.id for r in doomed],
                    "guard_decisions_forgotten": forgotten})
        return EXIT_OK
    c = out_console()
    if doomed:
        c.print(kernel_table(doomed, title="would delete" if args.dry_run else "deleted"))
    c.print(f"{'would delete' if args.dry_run else 'deleted'} {len(doomed)} kernel(s)")
    if forgotten:
        c.print(f"forgot {forgotten} graph guard decision(s)")
    return EXIT_OK


def _stats(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError, NoDatabaseError

    try:
        with open_store(args.db, create=False) as store:
            s = store.stats()
    except NoDatabaseError as e:
        missing_cache(args, e)
        if args.json:
            print_json({"url": e.where, "exists": False})
        return EXIT_OK
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json(asdict(s))
        return EXIT_OK
    t = Table("", "", show_header=False, title="kernel cache")
    t.add_row("database", s.url)
    t.add_row("schema version", str(s.schema_version))
    t.add_row("size", "-" if s.size_bytes is None else f"{s.size_bytes / 2**20:.1f} MiB")
    t.add_row("problems", str(s.problems))
    t.add_row("keys with a verified kernel", str(s.keys_with_verified))
    for st in STATUSES:
        t.add_row(f"kernels {st}", str(s.kernels_by_status.get(st, 0)))
    for b, n in sorted(s.kernels_by_backend.items()):
        t.add_row(f"kernels on {b}", str(n))
    t.add_row("runs (unfinished)", f"{s.runs} ({s.unfinished_runs})")
    t.add_row("evaluations", str(s.evaluations))
    t.add_row("evolution steps", str(s.steps))
    t.add_row("misses", str(s.misses))
    out_console().print(t)
    return EXIT_OK
