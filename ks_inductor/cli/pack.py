"""``kernelsmith pack export|verify|import|inspect|keygen``: kernel packs (.kspack) and their signing keys.

A thin layer over :mod:`kernel_cache.pack` (the format, export, merge), :mod:`ks_inductor.judge.packs`
(verification: the judge's static rules, the fit to this machine, golden vectors in the judge's sandbox) and, for
``pack export --hf-config MODEL``, the serving integrations (:mod:`kernelsmith_integrations.deployment`: the layer
problems a deployment meets; :func:`kernelsmith_integrations.ops.pack_for_problems`: warm them, export their
kernels). Exit codes: 0 done, 1 a refused pack or a layer problem left without a kernel, 2 a usage error.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernel_cache.access import open_store
from ks_inductor.cli.args import (
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_backend_argument,
    add_db_argument,
    add_json_argument,
    add_key_argument,
    add_model_arguments,
    add_search_arguments,
    batches,
    command,
    hidden_alias,
    positive_float,
    seqs,
)
from ks_inductor.cli.inputs import overrides
from ks_inductor.cli.output import (
    cache_error_code,
    err_console,
    fail,
    fmt_number,
    fmt_speedup,
    out_console,
    print_json,
    require_file,
    result_console,
)

STACKS = ("transformers", "sglang", "vllm", "lmdeploy")
# The flags that only mean something with --hf-config (dest -> flag), and those that select from the cache instead.
_WITH_MODEL = {"stack": "--stack", "hf_set": "--hf-set", "batch": "--batch", "seq": "--seq", "dtype": "--dtype",
               "device": "--device", "backend": "--backend"}
_NOT_WITH_MODEL = {"keys": "--key", "family": "--family", "fingerprint": "--fingerprint"}


def register(sub: Any) -> None:
    pack = command(sub, "pack", "export, verify, import and inspect kernel cache packs (.kspack)")
    actions = pack.add_subparsers(dest="pack_command", metavar="ACTION", required=True)

    p = command(actions, "export", "write verified kernels, their problems and golden vectors to a pack; with "
                                   "--hf-config MODEL, the pack a serving deployment of MODEL needs")
    add_db_argument(p)
    add_json_argument(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the pack to write (.kspack; required)")
    add_key_argument(p, "kernels")
    p.add_argument("--family", default=None, help="only this op family (default: all)")
    p.add_argument("--fingerprint", default=None, help="only this fingerprint id or hardware id (default: all)")
    p.add_argument("--min-speedup", type=positive_float, default=None, metavar="X",
                   help="only kernels at least this fast (the lower confidence bound when known; default: all)")
    p.add_argument("--sign-key", metavar="PEM", default=None,
                   help="ed25519 private key to sign the manifest with (default: unsigned)")
    p.add_argument("--no-vectors", action="store_true", help="omit golden vectors")
    g = p.add_argument_group("the pack a deployment needs (--hf-config)")
    add_model_arguments(g, source=None)
    hidden_alias(g, "--for", dest="hf_config", metavar="MODEL")
    g.add_argument("--stack", choices=STACKS, default=None,
                   help="with --hf-config: the serving stack whose layers the pack is for (default transformers; "
                        "sglang, vllm and lmdeploy need that stack's Python part installed)")
    add_backend_argument(g)
    add_search_arguments(g, per="layer problem")
    p.set_defaults(func=_export)

    for name, helptext in (("verify", "check a pack's integrity, safety and fit to this machine"),
                           ("import", "verify a pack, then merge it into the cache")):
        p = command(actions, name, helptext)
        if name == "import":
            add_db_argument(p)
        add_json_argument(p)
        p.add_argument("file", help="the pack (.kspack)")
        p.add_argument("--run", action="store_true", help="re-run the golden vectors here in the judge's sandbox")
        p.add_argument("--trust-key", action="append", dest="trust_keys", metavar="KEY", default=None,
                       help="trusted ed25519 public key (file or base64/hex); unsigned or wrongly signed packs "
                            "are refused (repeatable; default: the signature is not checked)")
        add_backend_argument(p)
        p.add_argument("--no-fingerprint-check", action="store_true",
                       help="skip the fit check (kernels for other hardware are still never served)")
        p.set_defaults(func=_verify if name == "verify" else _import)

    p = command(actions, "inspect", "print a pack's contents")
    add_json_argument(p)
    p.add_argument("file", help="the pack (.kspack)")
    p.set_defaults(func=_inspect)

    p = command(actions, "keygen", "make an ed25519 key pair for signing packs (PATH and PATH.pub)")
    p.add_argument("path", help="where to write the private key (the public one goes to PATH.pub)")
    p.set_defaults(func=_keygen)


# ---------------------------------------------------------------------------------------------- export


def _check_export(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together."""
    if args.hf_config is None:
        given = [flag for dest, flag in _WITH_MODEL.items() if getattr(args, dest) not in (None, [])]
        if given:
            raise UsageError(f"{given[0]} applies only with --hf-config MODEL")
        return
    given = [flag for dest, flag in _NOT_WITH_MODEL.items() if getattr(args, dest) not in (None, [])]
    if given:
        raise UsageError(f"{given[0]} selects kernels from the cache, --hf-config selects them from the model: "
                         "give one or the other")


def _export(args: argparse.Namespace) -> int:
    _check_export(args)
    return _export_for_model(args) if args.hf_config is not None else _export_cache(args)


def _export_cache(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from kernel_cache.pack import ExportFilters, export_pack
    from ks_inductor.cli.output import match_keys

    c = result_console(args)
    try:
        with open_store(args.db, create=False) as store, err_console().status(f"exporting to {args.output}"):
            filters = ExportFilters(keys=match_keys(store, args.keys), op_family=args.family,
                                    fingerprint=args.fingerprint, min_speedup=args.min_speedup)
            res = export_pack(store, args.output, filters, sign_key=args.sign_key, vectors=not args.no_vectors)
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json(asdict(res))
        return EXIT_OK
    c.print(f"wrote [bold]{res.path}[/]: {res.kernels} kernel(s), {res.problems} problem(s), golden vectors for "
            f"{res.with_vectors}, {res.size_bytes / 1024:.0f} KiB{', signed' if res.signed else ''} "
            f"in {res.seconds:.2f} s")
    for key, why in res.without_vectors.items():
        err_console().print(f"  [yellow]no vectors[/] for {key[:16]}: {why}")
    return EXIT_OK


def _export_for_model(args: argparse.Namespace) -> int:
    """0 when every layer problem has a kernel in the pack, 1 when some or all have none (the pack then holds the
    others; none is written when no problem has a kernel)."""
    from kernel_cache.errors import CacheError
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.judge.backends import BackendUnavailable

    try:
        from kernelsmith_integrations.deployment import DeploymentError, deployment_problems
        from kernelsmith_integrations.ops import pack_for_problems
    except ImportError as e:
        raise UsageError(f"--hf-config needs the serving integrations (kernelsmith_integrations): {e}") from None

    stack = args.stack or "transformers"
    console = err_console()
    try:
        with console.status(f"finding the layer problems of {args.hf_config}"):
            problems = deployment_problems(args.hf_config, stack, overrides(args), batches(args), seqs(args),
                                           args.dtype, args.device)
    except DeploymentError as e:
        raise UsageError(str(e)) from None
    if not problems:
        raise UsageError(f"{args.hf_config}: none of its layers is one a {stack} pack serves")
    config = EvolveConfig(budget=args.budget, time_limit_s=args.time_limit, islands=args.islands,
                          backend=args.backend, seed=args.seed, settle_at=args.settle_at)
    try:
        build = pack_for_problems(problems, args.output, db=args.db, config=config, sign_key=args.sign_key,
                                  console=console, vectors=not args.no_vectors, min_speedup=args.min_speedup,
                                  stack=stack)
    except (BackendUnavailable, CacheError) as e:
        raise UsageError(str(e)) from None
    res = build.export
    out = {"pack": res.path if res is not None else None, "stack": stack,
           "problems": [{"name": p.name, "key": p.key, "inputs": p.signature(), "packed": p.key not in build.missing,
                         **({"why": build.why_missing(p.key)} if p.key in build.missing else {})}
                        for p in build.problems],
           "missing": build.missing, "kernels": res.kernels if res is not None else 0,
           "with_vectors": res.with_vectors if res is not None else 0, "signed": bool(res and res.signed)}
    if args.json:
        print_json(out)
    else:
        t = Table("layer problem", "key", "inputs", "in the pack")
        for p in out["problems"]:
            t.add_row(p["name"], p["key"][:16], p["inputs"],
                      "packed" if p["packed"] else f"[yellow]missing[/]: {escape(p['why'])}")
        c = out_console()
        c.print(t)
        if res is None:
            c.print("no layer problem has a verified kernel for this machine; no pack written")
        else:
            c.print(f"wrote [bold]{res.path}[/]: {res.kernels} kernel(s) for {res.problems} of "
                    f"{len(build.problems)} layer problem(s), golden vectors for {res.with_vectors}"
                    f"{', signed' if res.signed else ''}")
    return EXIT_OK if res is not None and not build.missing else EXIT_NOTHING


# ---------------------------------------------------------------------------------------------- verify, import


def _fingerprint(args: argparse.Namespace) -> Any:
    if args.no_fingerprint_check:
        return None
    from ks_inductor.judge.backends import BackendUnavailable, current_fingerprint

    try:
        return current_fingerprint(args.backend)
    except BackendUnavailable as e:
        raise UsageError(f"cannot tell what this machine is: {e}") from None


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
           else "not read: the pack is damaged" if report.manifest is None else "unsigned")
    c.print(f"signature: {sig}")
    for w in report.warnings:
        c.print(f"[yellow]warning:[/] {w}")
    if report.ok:
        c.print("[bold green]pack is sound[/]")
    else:
        c.print("[bold red]pack refused:[/]")
        for r in report.reasons:
            c.print(f"  - {r}", markup=False)


def _report_json(report: Any) -> dict[str, Any]:
    d = asdict(report)
    d.pop("manifest", None)
    d["ok"] = report.ok
    return d


def _verify(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from ks_inductor.judge.packs import verify_pack

    require_file(args.file, "pack")
    fp = _fingerprint(args)
    try:
        judge = _judge(args)
        try:
            with err_console().status(f"verifying {args.file}"):
                report = verify_pack(args.file, trust_keys=args.trust_keys, fingerprint=fp,
                                     check_fingerprint=not args.no_fingerprint_check, run=args.run, judge=judge)
        finally:
            if judge is not None:
                judge.close()
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json(_report_json(report))
    else:
        _print_report(out_console(), report)
    return EXIT_OK if report.ok else EXIT_NOTHING


def _import(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError, PackError
    from kernel_cache.pack import merge_contents
    from ks_inductor.judge.packs import check_pack

    require_file(args.file, "pack")
    fp = _fingerprint(args)
    try:
        judge = _judge(args)
        t0 = time.perf_counter()
        try:
            # Verify before the database is even opened: a refused pack cannot touch it.
            with err_console().status(f"verifying {args.file}"):
                report, contents = check_pack(args.file, args.trust_keys, fp, not args.no_fingerprint_check,
                                              args.run, judge)
        finally:
            if judge is not None:
                judge.close()
        if contents is None:
            raise PackError(f"pack {args.file} refused; nothing was imported", report.reasons)
        with open_store(args.db, create=True) as store, err_console().status("merging"):
            res = merge_contents(report, contents, store, t0)
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    if args.json:
        print_json({"ok": True, "added": res.added, "kept": res.kept, "problems": res.problems,
                    "best": [o.kernel_id for o in res.outcomes if o.best], "warnings": report.warnings})
        return EXIT_OK
    c = out_console()
    t = Table("kernel id", "problem key", "action", "now best", title=f"imported {args.file}")
    for o in res.outcomes:
        t.add_row(str(o.kernel_id), o.record.problem_key[:16], o.action, "yes" if o.best else "")
    c.print(t)
    for w in report.warnings:
        err_console().print(f"[yellow]warning:[/] {w}")
    c.print(f"added {res.added}, kept {res.kept} already present, {res.problems} problem(s) in {res.seconds:.2f} s")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- inspect, keygen


def _inspect(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from kernel_cache.pack import inspect_pack

    require_file(args.file, "pack")
    info = inspect_pack(args.file)
    if info.manifest is None:
        return fail(args, CacheError(f"{args.file}: {info.error}"), EXIT_USAGE)
    m = info.manifest
    if args.json:
        print_json({"path": info.path, "signed": info.signed, "signer": info.signer,
                    "size_bytes": info.size_bytes, "manifest": m})
        return EXIT_OK
    c = out_console()
    c.print(f"[bold]{info.path}[/]  format {m.get('format_version')}, kernelsmith {m.get('kernelsmith_version')}, "
            f"torch {m.get('torch_version')}, triton {m.get('triton_version')}, created {m.get('created_at')}, "
            f"{info.size_bytes / 1024:.0f} KiB, " + (f"signed by key {info.signer}" if info.signed else "unsigned"))
    fps = m.get("fingerprints") or {}
    t = Table("#", "problem", "key", "family", "verified on", "torch/triton", "status", "speedup", "in a graph",
              "median ms", "vectors", "launch", "sha256")
    for i, k in enumerate(m.get("kernels") or []):
        fp = fps.get(k.get("fingerprint_id"), {})
        prob = info.problems.get(k.get("problem_key"), {})
        t.add_row(str(i), str(prob.get("name", "?")), str(k.get("problem_key", ""))[:16], k.get("op_family") or "-",
                  f"{fp.get('device_name', '?')} ({fp.get('backend', '?')})",
                  f"{fp.get('torch_version', '?')}/{fp.get('triton_version', '?')}", str(k.get("status")),
                  fmt_speedup(k.get("speedup")), fmt_speedup(k.get("speedup_graph")),
                  fmt_number(k.get("median_ms"), ".4f"),
                  "yes" if k.get("vectors") not in (None, "none") else "none",
                  "judged plan" if k.get("judged_plan") else "none: not served", str(k.get("sha256", ""))[:12])
    c.print(t)
    if any(k.get("status") == "race" for k in m.get("kernels") or []):
        c.print("status race: launch-bound, not slower on the device (the speedup shown) but not faster by the judge's "
                "margin; a stack serves it only where its load-time race, which times the call host included, finds "
                "it faster than the stack's own path")
    c.print("speedup: per call, against the baselines the pack was searched against; in a graph: inside a CUDA "
            "graph (how a stack that captures its decode step runs it), '-' where not timed there")
    c.print("launch: a kernel serves the launch plan its verdict was reached with (judged plan); one stored without "
            "a plan is not served (export the pack again from a cache that holds its plan)")
    err_console().print("run `kernelsmith pack verify` to check hashes, safety rules and fit; inspect only reads the "
                        "manifest")
    return EXIT_OK


def _keygen(args: argparse.Namespace) -> int:
    from kernel_cache.errors import CacheError
    from kernel_cache.signing import generate_keypair

    try:
        priv, pub = generate_keypair(args.path)
    except CacheError as e:
        return fail(args, e, cache_error_code(e))
    out_console().print(f"private key: {priv} (keep it secret)\npublic key:  {pub} (give to --trust-key)")
    return EXIT_OK
