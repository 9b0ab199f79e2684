"""``kernelsmith cache ...`` and ``kernelsmith pack ...``: thin commands over the store and pack libraries."""

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

_BACKENDS = ["triton-cuda", "triton-maca", "triton-interpret"]


def register(subparsers: Any) -> None:
    _register_cache(subparsers)
    _register_pack(subparsers)


# The one description of --db for every command (the default itself is kernel_cache.db.default_db_url).
DB_HELP = ("kernel cache: a SQLAlchemy URL or a SQLite file path (default: $KERNELSMITH_DB, else kernels.db in "
           "$KERNELSMITH_HOME, else in ~/.cache/kernelsmith)")


def add_db_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, metavar="URL", help=DB_HELP)


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _register_cache(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="list, inspect and maintain the kernel cache")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    p = sub.add_parser("ls", help="list kernels")
    add_db_argument(p)
    _json_arg(p)
    p.add_argument("--key", help="only this problem key (a prefix is enough)")
    p.add_argument("--status", choices=["verified", "quarantined", "rejected"], help="only kernels with this status")
    p.add_argument("--family", help="only this op family")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="show at most N kernels (default 100)")
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("show", help="show one kernel, with its source")
    add_db_argument(p)
    _json_arg(p)
    p.add_argument("id", type=int, help="kernel id (from cache ls)")
    p.add_argument("--no-source", action="store_true", help="leave the kernel's source out")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("rm", help="delete kernels by id")
    add_db_argument(p)
    _json_arg(p)
    p.add_argument("ids", type=int, nargs="+", metavar="ID", help="kernel ids (from cache ls)")
    p.set_defaults(func=_cmd_rm)

    p = sub.add_parser("gc", help="drop rejected kernels and all but the best few verified per key and fingerprint")
    add_db_argument(p)
    _json_arg(p)
    p.add_argument("--keep", type=int, default=3, help="verified kernels kept per key and fingerprint (default 3)")
    p.add_argument("--keep-rejected", action="store_true", help="keep rejected kernels")
    p.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    p.add_argument("--vacuum", action="store_true", help="compact the SQLite file afterwards")
    p.add_argument("--forget-guard", action="store_true",
                   help="also forget the graph guard's stored decisions (each graph is timed again when compiled)")
    p.set_defaults(func=_cmd_gc)

    p = sub.add_parser("stats", help="counts and size of the cache")
    add_db_argument(p)
    _json_arg(p)
    p.set_defaults(func=_cmd_stats)


def _register_pack(subparsers: Any) -> None:
    pack = subparsers.add_parser("pack", help="export, verify, import and inspect kernel cache packs (.kspack)")
    sub = pack.add_subparsers(dest="pack_command", metavar="ACTION", required=True)

    p = sub.add_parser("export", help="write verified kernels, their problems and golden vectors to a pack; with "
                                      "--for MODEL, the pack a serving deployment of MODEL needs")
    add_db_argument(p)
    _json_arg(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the pack to write (.kspack)")
    p.add_argument("--key", action="append", dest="keys", metavar="KEY", help="problem key (repeatable)")
    p.add_argument("--family", help="op family")
    p.add_argument("--fingerprint", help="fingerprint id or hardware id")
    p.add_argument("--min-speedup", type=float, help="minimum speedup (lower confidence bound when known)")
    p.add_argument("--sign-key", metavar="PEM", help="ed25519 private key to sign the manifest with")
    p.add_argument("--no-vectors", action="store_true", help="omit golden vectors")
    from integrations.pack_cli import add_arguments as add_model_arguments

    add_model_arguments(p)
    p.set_defaults(func=_cmd_export)

    for name, helptext in (("verify", "check a pack's integrity, safety and fit to this machine"),
                           ("import", "verify a pack, then merge it into the cache")):
        p = sub.add_parser(name, help=helptext)
        if name == "import":
            add_db_argument(p)
        _json_arg(p)
        p.add_argument("file", help="the pack (.kspack)")
        p.add_argument("--run", action="store_true", help="re-run the golden vectors here in the judge's sandbox")
        p.add_argument("--trust-key", action="append", dest="trust_keys", metavar="KEY",
                       help="trusted ed25519 public key (file or base64/hex); unsigned or wrongly signed packs "
                            "are refused (repeatable)")
        p.add_argument("--backend", choices=_BACKENDS, help="judge backend that defines this machine")
        p.add_argument("--no-fingerprint-check", action="store_true",
                       help="skip the fit check (kernels for other hardware are still never served)")
        p.set_defaults(func=_cmd_verify if name == "verify" else _cmd_import)

    p = sub.add_parser("inspect", help="print a pack's contents")
    _json_arg(p)
    p.add_argument("file", help="the pack (.kspack)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("keygen", help="make an ed25519 key pair for signing packs (PATH and PATH.pub)")
    p.add_argument("path", help="where to write the private key (the public one goes to PATH.pub)")
    p.set_defaults(func=_cmd_keygen)


# ============================================================================================ helpers


def _console(args: argparse.Namespace) -> Console:
    return Console(stderr=bool(getattr(args, "json", False)))


def _fail(args: argparse.Namespace, e: Exception, code: int | None = None) -> int:
    """Print ``e`` and return the exit code: 2 for what the user named wrongly (a database that cannot be opened
    or is not there, an unknown id), 1 for anything else (a refused pack, a damaged database)."""
    if code is None:
        code = 2 if isinstance(e, (DatabaseUnavailableError, NotFoundError)) else 1
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": str(e), "reasons": getattr(e, "reasons", [])}))
    Console(stderr=True).print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
    return code


def _store(args: argparse.Namespace, create: bool = False) -> Any:
    """The cache; only commands that store something create it (and its folder) when it does not exist yet."""
    from kernel_cache.store import KernelStore

    return KernelStore(args.db, create=create)


def _nothing_here(e: NoDatabaseError) -> None:
    """A command that lists found no cache: the same output as an empty one, and this line on stderr."""
    Console(stderr=True).print(f"{e}; nothing is stored yet", highlight=False, soft_wrap=True)


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _x(v: float | None) -> str:
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
                  f"[{colour.get(r.status, 'white')}]{r.status}[/]", _x(_speedup(r)),
                  _fmt(r.median_ms, ".4f"), r.sha256[:12], _when(r.created_at))
    return t


# ============================================================================================ cache


def _cmd_ls(args: argparse.Namespace) -> int:
    try:
        with _store(args) as store:
            records = store.kernels(status=args.status, op_family=args.family)
    except NoDatabaseError as e:
        _nothing_here(e)
        records = []
    except CacheError as e:
        return _fail(args, e)
    if args.key:
        records = [r for r in records if r.problem_key.startswith(args.key)]
    shown = records[: args.limit]
    if args.json:
        print(json.dumps([{k: v for k, v in r.to_json().items() if k != "source"} for r in shown]))
        return 0
    c = _console(args)
    if not records:
        c.print("no kernels match")
        return 0
    c.print(_kernel_table(shown))
    if len(records) > len(shown):
        c.print(f"{len(records) - len(shown)} more; use --limit")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    try:
        with _store(args) as store:
            r = store.get_kernel(args.id)
            problem = store.get_problem(r.problem_key)
    except CacheError as e:
        return _fail(args, e)
    if args.json:
        d = r.to_json()
        if args.no_source:
            d.pop("source")
        print(json.dumps(d))
        return 0
    c = _console(args)
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
        with _store(args) as store:
            for i in args.ids:
                store.get_kernel(i)  # refuse the whole command on an unknown id
            n = store.delete_kernels(args.ids)
    except CacheError as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps({"deleted": n}))
    else:
        _console(args).print(f"deleted {n} kernel(s)")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    try:
        with _store(args) as store:
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
        return _fail(args, e)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "deleted": [r.id for r in doomed],
                          "guard_decisions_forgotten": forgotten}))
        return 0
    c = _console(args)
    if doomed:
        c.print(_kernel_table(doomed, title="would delete" if args.dry_run else "deleted"))
    c.print(f"{'would delete' if args.dry_run else 'deleted'} {len(doomed)} kernel(s)")
    if forgotten:
        c.print(f"forgot {forgotten} graph guard decision(s)")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    try:
        with _store(args) as store:
            s = store.stats()
    except NoDatabaseError as e:
        _nothing_here(e)
        if args.json:
            print(json.dumps({"url": e.where, "exists": False}))
        return 0
    except CacheError as e:
        return _fail(args, e)
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
    _console(args).print(t)
    return 0


# ============================================================================================ pack


def _cmd_export(args: argparse.Namespace) -> int:
    from integrations.pack_cli import check, export_for_model
    from kernel_cache.pack import ExportFilters, export_pack

    check(args)
    if args.model is not None:
        return export_for_model(args)

    filters = ExportFilters(keys=args.keys, op_family=args.family, fingerprint=args.fingerprint,
                            min_speedup=args.min_speedup)
    c = _console(args)
    try:
        with _store(args) as store, c.status(f"exporting to {args.output}"):
            res = export_pack(store, args.output, filters, sign_key=args.sign_key, vectors=not args.no_vectors)
    except CacheError as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(asdict(res)))
        return 0
    c.print(f"wrote [bold]{res.path}[/]: {res.kernels} kernel(s), {res.problems} problem(s), golden vectors for "
            f"{res.with_vectors}, {res.size_bytes / 1024:.0f} KiB{', signed' if res.signed else ''} "
            f"in {res.seconds:.2f} s", highlight=False)
    for key, why in res.without_vectors.items():
        c.print(f"  [yellow]no vectors[/] for {key[:16]}: {why}", highlight=False)
    return 0


def _fingerprint(args: argparse.Namespace) -> Any:
    if args.no_fingerprint_check:
        return None
    from ks_inductor.judge.backends import BackendUnavailable, current_fingerprint

    try:
        return current_fingerprint(args.backend)
    except BackendUnavailable as e:
        raise CacheError(f"cannot tell what this machine is: {e}") from None


def _judge(args: argparse.Namespace) -> Any:
    if not args.run:
        return None
    from ks_inductor.judge import Judge, JudgeConfig

    return Judge(JudgeConfig(backend=args.backend), spares=False)


def _print_report(c: Console, report: Any) -> None:
    t = Table("#", "problem key", "verified on", "fit", "vectors", "sha256", title=report.path)
    colour = {"exact": "green", "reverify": "yellow", "none": "red", "passed": "green", "failed": "red"}
    for k in report.kernels:
        t.add_row(str(k.index), k.problem_key[:16], k.fingerprint or "-",
                  f"[{colour.get(k.fit, 'white')}]{k.fit or '-'}[/]",
                  f"[{colour.get(k.vectors, 'white')}]{k.vectors}[/]", k.sha256[:12])
    if report.kernels:
        c.print(t)
    sig = ("signature checked" if report.signature_checked else "signed, not checked" if report.signed
           else "unsigned")
    c.print(f"signature: {sig}")
    for w in report.warnings:
        c.print(f"[yellow]warning:[/] {w}", highlight=False)
    if report.ok:
        c.print("[bold green]pack is sound[/]")
    else:
        c.print("[bold red]pack refused:[/]")
        for r in report.reasons:
            c.print(f"  - {r}", highlight=False)


def _report_json(report: Any) -> dict[str, Any]:
    d = asdict(report)
    d.pop("manifest", None)
    d["ok"] = report.ok
    return d


def _cmd_verify(args: argparse.Namespace) -> int:
    from kernel_cache.pack import verify_pack

    c = _console(args)
    try:
        fp = _fingerprint(args)
        judge = _judge(args)
        try:
            with c.status(f"verifying {args.file}"):
                report = verify_pack(args.file, trust_keys=args.trust_keys, fingerprint=fp,
                                     check_fingerprint=not args.no_fingerprint_check, run=args.run, judge=judge)
        finally:
            if judge is not None:
                judge.close()
    except CacheError as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(_report_json(report)))
    else:
        _print_report(c, report)
    return 0 if report.ok else 1


def _cmd_import(args: argparse.Namespace) -> int:
    from kernel_cache.errors import PackError
    from kernel_cache.pack import check_pack, merge_contents

    c = _console(args)
    try:
        fp = _fingerprint(args)
        judge = _judge(args)
        t0 = time.perf_counter()
        try:
            # Verify before the database is even opened: a refused pack cannot touch it.
            with c.status(f"verifying {args.file}"):
                report, contents = check_pack(args.file, args.trust_keys, fp, not args.no_fingerprint_check,
                                              args.run, judge)
        finally:
            if judge is not None:
                judge.close()
        if contents is None:
            raise PackError(f"pack {args.file} refused; nothing was imported", report.reasons)
        with _store(args, create=True) as store, c.status("merging"):
            res = merge_contents(report, contents, store, t0)
    except CacheError as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps({"ok": True, "added": res.added, "kept": res.kept, "problems": res.problems,
                          "best": [o.kernel_id for o in res.outcomes if o.best], "warnings": report.warnings}))
        return 0
    t = Table("kernel id", "problem key", "action", "now best", title=f"imported {args.file}")
    for o in res.outcomes:
        t.add_row(str(o.kernel_id), o.record.problem_key[:16], o.action, "yes" if o.best else "")
    c.print(t)
    for w in report.warnings:
        c.print(f"[yellow]warning:[/] {w}", highlight=False)
    c.print(f"added {res.added}, kept {res.kept} already present, {res.problems} problem(s) in {res.seconds:.2f} s")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from kernel_cache.pack import inspect_pack

    info = inspect_pack(args.file)
    if info.manifest is None:
        return _fail(args, CacheError(f"{args.file}: {info.error}"))
    m = info.manifest
    if args.json:
        print(json.dumps({"path": info.path, "signed": info.signed, "signer": info.signer,
                          "size_bytes": info.size_bytes, "manifest": m}))
        return 0
    c = _console(args)
    c.print(f"[bold]{info.path}[/]  format {m.get('format_version')}, kernelsmith {m.get('kernelsmith_version')}, "
            f"torch {m.get('torch_version')}, triton {m.get('triton_version')}, created {m.get('created_at')}, "
            f"{info.size_bytes / 1024:.0f} KiB, " + (f"signed by key {info.signer}" if info.signed else "unsigned"),
            highlight=False)
    fps = m.get("fingerprints") or {}
    t = Table("#", "problem", "key", "family", "verified on", "torch/triton", "status", "speedup", "median ms",
              "vectors", "sha256")
    for i, k in enumerate(m.get("kernels") or []):
        fp = fps.get(k.get("fingerprint_id"), {})
        prob = info.problems.get(k.get("problem_key"), {})
        t.add_row(str(i), str(prob.get("name", "?")), str(k.get("problem_key", ""))[:16], k.get("op_family") or "-",
                  f"{fp.get('device_name', '?')} ({fp.get('backend', '?')})",
                  f"{fp.get('torch_version', '?')}/{fp.get('triton_version', '?')}", str(k.get("status")),
                  _x(k.get("speedup")), _fmt(k.get("median_ms"), ".4f"),
                  "yes" if k.get("vectors") not in (None, "none") else "none", str(k.get("sha256", ""))[:12])
    c.print(t)
    c.print("run `kernelsmith pack verify` to check hashes, safety rules and fit; inspect only reads the manifest")
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from kernel_cache.signing import generate_keypair

    try:
        priv, pub = generate_keypair(args.path)
    except CacheError as e:
        return _fail(args, e)
    Console().print(f"private key: {priv} (keep it secret)\npublic key:  {pub} (give to --trust-key)")
    return 0
