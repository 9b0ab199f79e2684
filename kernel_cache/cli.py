"""``kernelsmith cache ...``: thin commands over the store, and the flags and output helpers every command that
opens a cache shares (``--db``, ``--json``, one-line errors). ``kernelsmith pack`` is :mod:`ks_inductor.pack_cli`:
verifying a pack is the judge's work."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from kernel_cache.errors import CacheError, DatabaseUnavailableError, NoDatabaseError, NotFoundError
from kernel_cache.record import KernelRecord


def register(subparsers: Any) -> None:
    _register_cache(subparsers)


# The one description of --db for every command (the default itself is kernel_cache.db.default_db_url).
DB_HELP = ("kernel cache: a SQLAlchemy URL or a SQLite file path (default: $KERNELSMITH_DB, else kernels.db in "
           "$KERNELSMITH_HOME, else in ~/.cache/kernelsmith)")


def add_db_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, metavar="URL", help=DB_HELP)


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _register_cache(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="list, inspect and maintain the kernel cache")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    p = sub.add_parser("ls", help="list kernels")
    add_db_argument(p)
    add_json_flag(p)
    p.add_argument("--key", help="only this problem key (a prefix is enough)")
    p.add_argument("--status", choices=["verified", "quarantined", "rejected"], help="only kernels with this status")
    p.add_argument("--family", help="only this op family")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="show at most N kernels (default 100)")
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("show", help="show one kernel, with its source")
    add_db_argument(p)
    add_json_flag(p)
    p.add_argument("id", type=int, help="kernel id (from cache ls)")
    p.add_argument("--no-source", action="store_true", help="leave the kernel's source out")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("rm", help="delete kernels by id")
    add_db_argument(p)
    add_json_flag(p)
    p.add_argument("ids", type=int, nargs="+", metavar="ID", help="kernel ids (from cache ls)")
    p.set_defaults(func=_cmd_rm)

    p = sub.add_parser("gc", help="drop rejected kernels and all but the best few verified per key and fingerprint")
    add_db_argument(p)
    add_json_flag(p)
    p.add_argument("--keep", type=int, default=3, help="verified kernels kept per key and fingerprint (default 3)")
    p.add_argument("--keep-rejected", action="store_true", help="keep rejected kernels")
    p.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    p.add_argument("--vacuum", action="store_true", help="compact the SQLite file afterwards")
    p.add_argument("--forget-guard", action="store_true",
                   help="also forget the graph guard's stored decisions (each graph is timed again when compiled)")
    p.set_defaults(func=_cmd_gc)

    p = sub.add_parser("stats", help="counts and size of the cache")
    add_db_argument(p)
    add_json_flag(p)
    p.set_defaults(func=_cmd_stats)


# ============================================================================================ helpers


def cli_console(args: argparse.Namespace) -> Console:
    return Console(stderr=bool(getattr(args, "json", False)))


def cli_fail(args: argparse.Namespace, e: Exception, code: int | None = None) -> int:
    """Print ``e`` and return the exit code: 2 for what the user named wrongly (a database that cannot be opened
    or is not there, an unknown id), 1 for anything else (a refused pack, a damaged database)."""
    if code is None:
        code = 2 if isinstance(e, (DatabaseUnavailableError, NotFoundError)) else 1
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": str(e), "reasons": getattr(e, "reasons", [])}))
    Console(stderr=True).print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
    return code


def cli_store(args: argparse.Namespace, create: bool = False) -> Any:
    """The cache; only commands that store something create it (and its folder) when it does not exist yet."""
    from kernel_cache.store import KernelStore

    return KernelStore(args.db, create=create)


def _nothing_here(e: NoDatabaseError) -> None:
    """A command that lists found no cache: the same output as an empty one, and this line on stderr."""
    Console(stderr=True).print(f"{e}; nothing is stored yet", highlight=False, soft_wrap=True)


def fmt_number(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def fmt_speedup(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _speedup(r: KernelRecord) -> float | None:
    from kernel_cache.migrations import rank_of

    return rank_of(r.speedup_lcb, r.speedup_inductor, r.speedup_eager)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _kernel_table(records: list[KernelRecord], title: str | None = None) -> Table:
    t = Table("id", "problem key", "family", "device", "status", "speedup", "median ms", "sha256", "created",
              title=title)
    colour = {"verified": "green", "quarantined": "yellow", "rejected": "red"}
    for r in records:
        fp = r.fingerprint
        t.add_row(str(r.id), r.problem_key[:16], r.op_family or "-",
                  f"{fp.get('device_name', '?')} ({fp.get('backend', '?')})",
                  f"[{colour.get(r.status, 'white')}]{r.status}[/]", fmt_speedup(_speedup(r)),
                  fmt_number(r.median_ms, ".4f"), r.sha256[:12], _when(r.created_at))
    return t


# ============================================================================================ cache


def _cmd_ls(args: argparse.Namespace) -> int:
    try:
        with cli_store(args) as store:
            records = store.kernels(status=args.status, op_family=args.family)
    except NoDatabaseError as e:
        _nothing_here(e)
        records = []
    except CacheError as e:
        return cli_fail(args, e)
    if args.key:
        records = [r for r in records if r.problem_key.startswith(args.key)]
    shown = records[: args.limit]
    if args.json:
        print(json.dumps([{k: v for k, v in r.to_json().items() if k != "source"} for r in shown]))
        return 0
    c = cli_console(args)
    if not records:
        c.print("no kernels match")
        return 0
    c.print(_kernel_table(shown))
    if len(records) > len(shown):
        c.print(f"{len(records) - len(shown)} more; use --limit")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    try:
        with cli_store(args) as store:
            r = store.get_kernel(args.id)
            problem = store.get_problem(r.problem_key)
    except CacheError as e:
        return cli_fail(args, e)
    if args.json:
        d = r.to_json()
        if args.no_source:
            d.pop("source")
        print(json.dumps(d))
        return 0
    c = cli_console(args)
    t = Table("field", "value", show_header=False)
    for k, v in r.to_json().items():
        if k in ("source", "fingerprint"):
            continue
        t.add_row(k, _when(v) if k == "created_at" else str(v))
    t.add_row("fingerprint", json.dumps(r.fingerprint))
    if problem is not None:
        t.add_row("problem", f"{problem.name}: {problem.signature()}")
    c.print(t)
    if not args.no_source:
        from rich.syntax import Syntax

        c.print(Syntax(r.source, "python", line_numbers=True))
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    try:
        with cli_store(args) as store:
            for i in args.ids:
                store.get_kernel(i)  # refuse the whole command on an unknown id
            n = store.delete_kernels(args.ids)
    except CacheError as e:
        return cli_fail(args, e)
    if args.json:
        print(json.dumps({"deleted": n}))
    else:
        cli_console(args).print(f"deleted {n} kernel(s)")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    try:
        with cli_store(args) as store:
            doomed = store.gc_plan(keep=args.keep, drop_rejected=not args.keep_rejected)
            forgotten = 0
            if not args.dry_run:
                store.delete_kernels([r.id for r in doomed if r.id is not None])
                if args.forget_guard:
                    forgotten = store.clear_guard_decisions()
                if args.vacuum:
                    store.vacuum()
    except NoDatabaseError as e:
        _nothing_here(e)
        doomed, forgotten = [], 0
    except CacheError as e:
        return cli_fail(args, e)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "deleted": [r.id for r in doomed],
                          "guard_decisions_forgotten": forgotten}))
        return 0
    c = cli_console(args)
    if doomed:
        c.print(_kernel_table(doomed, title="would delete" if args.dry_run else "deleted"))
    c.print(f"{'would delete' if args.dry_run else 'deleted'} {len(doomed)} kernel(s)")
    if forgotten:
        c.print(f"forgot {forgotten} graph guard decision(s)")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    try:
        with cli_store(args) as store:
            s = store.stats()
    except NoDatabaseError as e:
        _nothing_here(e)
        if args.json:
            print(json.dumps({"url": e.where, "exists": False}))
        return 0
    except CacheError as e:
        return cli_fail(args, e)
    if args.json:
        print(json.dumps(asdict(s)))
        return 0
    t = Table("", "", show_header=False, title="kernel cache")
    t.add_row("database", s.url)
    t.add_row("schema version", str(s.schema_version))
    t.add_row("size", "-" if s.size_bytes is None else f"{s.size_bytes / 2**20:.1f} MiB")
    t.add_row("problems", str(s.problems))
    t.add_row("keys with a verified kernel", str(s.keys_with_verified))
    for st in ("verified", "quarantined", "rejected"):
        t.add_row(f"kernels {st}", str(s.kernels_by_status.get(st, 0)))
    for b, n in sorted(s.kernels_by_backend.items()):
        t.add_row(f"kernels on {b}", str(n))
    t.add_row("runs (unfinished)", f"{s.runs} ({s.unfinished_runs})")
    t.add_row("evaluations", str(s.evaluations))
    t.add_row("evolution steps", str(s.steps))
    t.add_row("misses", str(s.misses))
    cli_console(args).print(t)
    return 0


# ============================================================================================ pack


