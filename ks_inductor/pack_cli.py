"""``kernelsmith pack ...``: export, verify, import and inspect kernel packs (.kspack), and make signing keys.

A thin layer over :mod:`kernel_cache.pack` (the format, export, merge) and :mod:`ks_inductor.judge.packs`
(verification: the judge's static rules, the fit to this machine, golden vectors in the judge's sandbox).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from kernel_cache.cli import (
    add_db_argument,
    add_json_flag,
    cli_console,
    cli_fail,
    cli_store,
    fmt_number,
    fmt_speedup,
)
from kernel_cache.errors import CacheError
from ks_inductor.judge.backends import BACKEND_NAMES


def register(subparsers: Any) -> None:
    _register_pack(subparsers)


def _register_pack(subparsers: Any) -> None:
    pack = subparsers.add_parser("pack", help="export, verify, import and inspect kernel cache packs (.kspack)")
    sub = pack.add_subparsers(dest="pack_command", metavar="ACTION", required=True)

    # The serving integrations add --for MODEL to this command when they are there (their pack_cli.register).
    p = sub.add_parser("export", help="write verified kernels, their problems and golden vectors to a pack; with "
                                      "--for MODEL, the pack a serving deployment of MODEL needs")
    add_db_argument(p)
    add_json_flag(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the pack to write (.kspack)")
    p.add_argument("--key", action="append", dest="keys", metavar="KEY", help="problem key (repeatable)")
    p.add_argument("--family", help="op family")
    p.add_argument("--fingerprint", help="fingerprint id or hardware id")
    p.add_argument("--min-speedup", type=float, help="minimum speedup (lower confidence bound when known)")
    p.add_argument("--sign-key", metavar="PEM", help="ed25519 private key to sign the manifest with")
    p.add_argument("--no-vectors", action="store_true", help="omit golden vectors")
    p.set_defaults(func=_cmd_export)

    for name, helptext in (("verify", "check a pack's integrity, safety and fit to this machine"),
                           ("import", "verify a pack, then merge it into the cache")):
        p = sub.add_parser(name, help=helptext)
        if name == "import":
            add_db_argument(p)
        add_json_flag(p)
        p.add_argument("file", help="the pack (.kspack)")
        p.add_argument("--run", action="store_true", help="re-run the golden vectors here in the judge's sandbox")
        p.add_argument("--trust-key", action="append", dest="trust_keys", metavar="KEY",
                       help="trusted ed25519 public key (file or base64/hex); unsigned or wrongly signed packs "
                            "are refused (repeatable)")
        p.add_argument("--backend", choices=list(BACKEND_NAMES), help="judge backend that defines this machine")
        p.add_argument("--no-fingerprint-check", action="store_true",
                       help="skip the fit check (kernels for other hardware are still never served)")
        p.set_defaults(func=_cmd_verify if name == "verify" else _cmd_import)

    p = sub.add_parser("inspect", help="print a pack's contents")
    add_json_flag(p)
    p.add_argument("file", help="the pack (.kspack)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("keygen", help="make an ed25519 key pair for signing packs (PATH and PATH.pub)")
    p.add_argument("path", help="where to write the private key (the public one goes to PATH.pub)")
    p.set_defaults(func=_cmd_keygen)


def _cmd_export(args: argparse.Namespace) -> int:
    from kernel_cache.pack import ExportFilters, export_pack

    filters = ExportFilters(keys=args.keys, op_family=args.family, fingerprint=args.fingerprint,
                            min_speedup=args.min_speedup)
    c = cli_console(args)
    try:
        with cli_store(args) as store, c.status(f"exporting to {args.output}"):
            res = export_pack(store, args.output, filters, sign_key=args.sign_key, vectors=not args.no_vectors)
    except CacheError as e:
        return cli_fail(args, e)
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
    from ks_inductor.judge.packs import verify_pack

    c = cli_console(args)
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
        return cli_fail(args, e)
    if args.json:
        print(json.dumps(_report_json(report)))
    else:
        _print_report(c, report)
    return 0 if report.ok else 1


def _cmd_import(args: argparse.Namespace) -> int:
    from kernel_cache.errors import PackError
    from kernel_cache.pack import merge_contents
    from ks_inductor.judge.packs import check_pack

    c = cli_console(args)
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
        with cli_store(args, create=True) as store, c.status("merging"):
            res = merge_contents(report, contents, store, t0)
    except CacheError as e:
        return cli_fail(args, e)
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
        return cli_fail(args, CacheError(f"{args.file}: {info.error}"))
    m = info.manifest
    if args.json:
        print(json.dumps({"path": info.path, "signed": info.signed, "signer": info.signer,
                          "size_bytes": info.size_bytes, "manifest": m}))
        return 0
    c = cli_console(args)
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
                  fmt_speedup(k.get("speedup")), fmt_number(k.get("median_ms"), ".4f"),
                  "yes" if k.get("vectors") not in (None, "none") else "none", str(k.get("sha256", ""))[:12])
    c.print(t)
    c.print("run `kernelsmith pack verify` to check hashes, safety rules and fit; inspect only reads the manifest")
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from kernel_cache.signing import generate_keypair

    try:
        priv, pub = generate_keypair(args.path)
    except CacheError as e:
        return cli_fail(args, e)
    Console().print(f"private key: {priv} (keep it secret)\npublic key:  {pub} (give to --trust-key)")
    return 0
