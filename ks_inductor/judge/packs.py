"""Verifying a kernel pack is the judge's work: the pack's format and integrity are the cache's
(:func:`kernel_cache.pack.read_pack`), then every kernel meets the judge's static rules, its fingerprint is held
against this machine's, and with ``run`` its golden vectors run in the judge's sandbox. Nothing from a pack runs
in this process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kernel_cache.errors import PackError
from kernel_cache.pack import (
    ImportResult,
    PackContents,
    VerifyReport,
    check_fit,
    golden_inputs,
    merge_contents,
    read_pack,
)
from kernel_cache.store import KernelStore
from ks_core.fingerprint import EnvFingerprint


def check_pack(path: str | os.PathLike[str], trust_keys: list[Any] | None, fingerprint: EnvFingerprint | None,
               check_fingerprint: bool = True, run: bool = False,
               judge: Any = None) -> tuple[VerifyReport, PackContents | None]:
    """``verify_pack``, also returning the parsed contents when the pack is sound (None otherwise)."""
    report, contents = read_pack(path, trust_keys)
    if contents is None:
        return report, None
    _check_static(contents, report)
    if check_fingerprint:
        if fingerprint is None:
            from ks_inductor.judge.backends import current_fingerprint

            fingerprint = current_fingerprint()
        check_fit(contents, fingerprint, report)
    else:
        report.warnings.append("fingerprints were not checked against this machine")
    if run and not report.reasons:  # never execute kernels from a pack already found unsound
        if judge is None:
            from ks_inductor.judge import Judge

            with Judge(spares=False) as own:
                _run_vectors(contents, own, report)
        else:
            _run_vectors(contents, judge, report)
    elif not run:
        for c in report.kernels:
            c.vectors = "not run"
    return report, (contents if report.ok else None)


def verify_pack(path: str | os.PathLike[str], *, trust_keys: list[Any] | None = None,
                fingerprint: EnvFingerprint | None = None, check_fingerprint: bool = True, run: bool = False,
                judge: Any = None) -> VerifyReport:
    """Check a pack: zip integrity, manifest format, signature (when keys are trusted), every sha256, the judge's
    static safety rules on every kernel, the fingerprints against this machine (``fingerprint``; None detects
    it), and with ``run`` the golden vectors in the judge's sandbox. ``report.ok`` says whether it is sound."""
    return check_pack(path, trust_keys, fingerprint, check_fingerprint, run, judge)[0]


def import_pack(path: str | os.PathLike[str], store: KernelStore, *, trust_keys: list[Any] | None = None,
                fingerprint: EnvFingerprint | None = None, check_fingerprint: bool = True, run: bool = False,
                judge: Any = None) -> ImportResult:
    """Verify, then merge into ``store`` in one transaction. Raises PackError (database untouched) if refused."""
    t0 = time.perf_counter()
    report, contents = check_pack(path, trust_keys, fingerprint, check_fingerprint, run, judge)
    if contents is None:
        raise PackError(f"pack {path} refused; nothing was imported", report.reasons)
    return merge_contents(report, contents, store, t0)


def _check_static(contents: PackContents, report: VerifyReport) -> None:
    from ks_inductor.judge.static_checks import static_check
    from ks_inductor.judged_plan import plan_fault

    problems = {p.key: p for p in contents.problems}
    for check, rec in zip(report.kernels, contents.kernels):
        msgs = [f"static safety rule '{flag}': {why}" for flag, why in static_check(rec.source)]
        # A kernel's judged plan is what serving launches: it is checked against its source as the source is.
        problem = problems.get(rec.problem_key)
        fault = plan_fault(rec.plan, rec.source, len(problem.input_specs)) if problem is not None else ""
        if fault:
            msgs.append(fault)
        elif not rec.plan:
            report.warnings.append(f"kernel {check.index} ({rec.problem_key[:12]}): carries no judged plan, so no stack "
                                   "serves it (export the pack again from a cache that holds its plan)")
        for m in msgs:
            msg = f"kernel {check.index} ({rec.problem_key[:12]}): {m}"
            check.reasons.append(msg)
            report.reasons.append(msg)


def _run_vectors(contents: PackContents, judge: Any, report: VerifyReport) -> None:
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for check, rec in zip(report.kernels, contents.kernels):
        blob = contents.vectors.get(rec.problem_key)
        if blob is None:
            check.vectors = "none"
            pe = next(p for p in contents.manifest["problems"] if p["key"] == rec.problem_key)
            report.warnings.append(f"kernel {check.index} not re-run: no golden vectors ({pe.get('vectors_note')})")
            continue
        jobs.append((check, rec, *golden_inputs(blob)))
    if not jobs:
        return
    # The judge is thread-safe and runs each call in its own sandboxed worker; overlap their start-up.
    with ThreadPoolExecutor(max_workers=min(4, len(jobs)), thread_name_prefix="ks-pack-run") as pool:
        results = list(pool.map(lambda j: judge.run_vectors(j[1].source, j[2], j[3], j[4]), jobs))
    for (check, rec, *_), res in zip(jobs, results):
        if res.verdict == "accepted":
            check.vectors = "passed"
        else:
            check.vectors = "failed"
            why = "; ".join(res.reasons) or res.error or res.verdict
            msg = f"kernel {check.index} ({rec.problem_key[:12]}) failed its golden vectors here: {why}"
            check.reasons.append(msg)
            report.reasons.append(msg)
