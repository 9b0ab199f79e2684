"""The guard every serving integration shares: a pack verified on load, kernels proven on the target device before
first use, and a per-call check that sends anything a kernel was not verified for to the stack's own path.

Verification on load is ``kernel_cache.pack.check_pack`` (zip integrity, every sha256, the signature, the judge's
static rules, the fingerprint fit); the guard adds nothing to it but what only a serving process can do: run each
kernel's golden vectors on the device the layer actually runs on, once, before the kernel's first result is
used. A refused pack is one log line and no swap: a model never stops working because of a pack.

Matching a layer to a pack problem is the caller's part (``integrations.ops``): it traces the layer's own
computation at a problem's input signature and compares canonical keys, so a kernel serves a layer only where the
two compute the same aten graph.

The guard's parts, one job each: what a deployment sets and the fallback reasons (:mod:`integrations.serving`),
which stack versions are served (:mod:`integrations.admission`), a pack kernel and its checks on the device
(:mod:`integrations.checks`), racing it against the stack's own path (:mod:`integrations.race`), and an op as a
stack calls it (:mod:`integrations.served_op`). This module holds the guard itself and loading it, and hands on
the names a stack's integration uses from the others.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernel_cache.record import RACE
from ks_core.settings import Settings

from .admission import installed_version, parse_version, version_known
from .checks import PackKernel, kernel_rank, run_against_stack, run_golden_vectors
from .ops import Binding, key_function
from .race import OnCopies, race, racing_now, racing_on, serve_margin, wins
from .served_op import ServedOp
from .serving import (
    ENV_DISABLE,
    ENV_PACK,
    ENV_SERVE_MARGIN,
    ENV_SERVE_RACE,
    ENV_TRUSTED_KEYS,
    R_CALL,
    R_DECLINED,
    R_DEVICE,
    R_DISABLED,
    R_DTYPE,
    R_ERROR,
    R_GRAD,
    R_NO_VECTORS,
    R_OUTPUT,
    R_SHAPE,
    R_SIGNATURE,
    R_SLOWER,
    R_STRIDE,
    R_VECTORS,
    SERVING_ENV,
    disabled,
    trusted_keys_from_env,
)
from .signature import FreeDims, Signature, random_inputs, spec_signature

__all__ = [
    "ENV_DISABLE", "ENV_PACK", "ENV_SERVE_MARGIN", "ENV_SERVE_RACE", "ENV_TRUSTED_KEYS", "SERVING_ENV",
    "R_CALL", "R_DECLINED", "R_DEVICE", "R_DISABLED", "R_DTYPE", "R_ERROR", "R_GRAD", "R_NO_VECTORS", "R_OUTPUT",
    "R_SHAPE", "R_SIGNATURE", "R_SLOWER", "R_STRIDE", "R_VECTORS",
    "OnCopies", "PackGuard", "PackKernel", "ServedOp", "StackState", "admit", "disabled", "empty_stats",
    "installed_version", "load_guard", "parse_version", "race", "racing_on", "serve_margin", "spec_signature",
    "trusted_keys_from_env", "version_known", "wins",
]

log = logging.getLogger("kernelsmith.integrations")


class PackGuard:
    """A verified pack inside a serving stack: its kernels by problem key, and the hit and fallback counters."""

    def __init__(self, stack: str, path: str, report: Any, contents: Any, fingerprint: Any) -> None:
        from ks_core.fingerprint import BACKEND_CPU_INTERPRET

        self.stack = stack
        self.path = path
        self.report = report
        self.fingerprint = fingerprint
        # The interpreter runs kernels on CPU tensors; every other backend on the GPU (MetaX included: torch
        # calls its devices cuda).
        self.device_type = "cpu" if fingerprint.backend == BACKEND_CPU_INTERPRET else "cuda"
        self.problems = {p.key: p for p in contents.problems}
        ranked = sorted(zip(contents.manifest["kernels"], contents.kernels), key=lambda kr: -kernel_rank(kr[0]))
        self.kernels: dict[str, list[PackKernel]] = {}
        for _, rec in ranked:
            p = self.problems.get(rec.problem_key)
            if p is not None:
                self.kernels.setdefault(rec.problem_key, []).append(
                    PackKernel(rec, p, contents.vectors.get(rec.problem_key)))
        # Per op, a counter a served call advances in one atomic step, with no lock (see ``hit_counter``).
        self._hits: dict[str, itertools.count] = {}
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        # Read when the pack is loaded; the race itself runs once per kernel, at its first use.
        self.race = racing_on(self.device_type)
        self.margin = serve_margin()
        # Bumped whenever a kernel's state changes: served ops keep their per-signature decisions until then.
        self.epoch = 0

    # ---------------------------------------------------------------------------------------- binding

    def bind(self, op: str, key_of: Callable[[Signature], str | None],
             reference: Callable[..., Any] | None = None, arity: int | None = None,
             own: Callable[..., Any] | None = None, free: FreeDims = ()) -> ServedOp:
        """The pack kernels that compute ``op`` as the caller's ``reference`` does: ``key_of(signature)`` is the
        canonical key of that computation at a signature (None when it cannot be traced there); only problems of
        ``arity`` inputs are tried when given. The reference also proves, on the device, a kernel whose problem
        shipped without golden vectors. ``own`` is what the stack runs for the op where no kernel serves (the same
        inputs and outputs as ``reference``, leaving its inputs as they were; ``OnCopies`` makes an in-place path
        so); racing times kernels against it, else against ``reference``.

        ``free``: dims along which a kernel may also serve signatures its problem does not have (a decode step's
        cache length). Such a signature, and one whose inputs are laid out densely in another order
        (``signature.provable_at``), is proven once against ``reference`` on random inputs before a call there is
        served, and raced once per power-of-two bucket of those sizes and per layout; a kernel that bakes in its
        problem's sizes or strides fails that proof, and the stack's own path runs there."""
        table: dict[Signature, str] = {}
        for key, p in self.problems.items():
            if key not in self.kernels or p.init_inputs:
                continue  # kernels with constructor arguments hold their own weights: not a layer's op
            sig = spec_signature(p.input_specs)
            if sig is None or (arity is not None and len(sig) != arity):
                continue
            try:
                mine = key_of(sig)
            except Exception as e:  # noqa: BLE001 - a reference that does not trace here matches nothing
                log.debug("kernelsmith: %s does not trace at %s: %s", op, sig, e)
                mine = None
            if mine == key:
                table[sig] = key
        return ServedOp(self, op, table, reference, own, free)

    # ---------------------------------------------------------------------------------------- serving

    def ready_kernel(self, key: str, device: torch.device, reference: Callable[..., Any] | None = None,
                     own: Callable[..., Any] | None = None) -> PackKernel | None:
        """The best kernel for ``key`` proven on ``device``: by the pack's golden vectors, or where the problem has
        none, against ``reference`` (the stack's own computation). Each kernel is proven once, before first use;
        with racing on, a proven kernel serves only where it also beat ``own`` (else ``reference``) there."""
        for k in self.kernels.get(key, []):
            if k.state == "passed":
                return k
            if k.state == "unchecked" or (k.state == "none" and reference is not None):
                with k.lock:
                    if k.state == "unchecked" or (k.state == "none" and reference is not None):
                        self._prove(k, key, device, reference, own if own is not None else reference)
            if k.state == "passed":
                return k
        return None

    def _prove(self, k: PackKernel, key: str, device: torch.device, reference: Callable[..., Any] | None,
               own: Callable[..., Any] | None) -> None:
        ok, why = run_golden_vectors(k, device)
        how = "its golden vectors"
        if why == R_NO_VECTORS and reference is not None:
            ok, why = run_against_stack(k, device, reference)
            how = f"a check against {self.stack}'s own computation"
        if not ok:
            k.state, k.note = ("none" if why == R_NO_VECTORS else "failed"), why
            log.warning("kernelsmith: kernel %s for %s not served: %s", k.record.sha256[:12], key[:12], why)
        else:
            if device.type == "cuda":
                from .launch_plan import make_plan

                sig = spec_signature(k.problem.input_specs)
                if sig is not None:
                    k.plan, k.plan_note = make_plan(k.judged_call, random_inputs(sig, device))
                    log.info("kernelsmith: kernel %s for %s %s", k.record.sha256[:12], key[:12],
                             "launches through a static launcher" if k.plan is not None
                             else f"runs its judged plan step by step: {k.plan_note}")
            # The state is set once the race is over: a kernel another thread sees "passed" has won it.
            slower = self.race_kernel(k, key, device, own) if self.race and own is not None else ""
            if not slower and k.record.status == RACE and k.race_us is None:
                slower = ("its verdict leaves serving it to a race at load time (launch-bound, and not faster on the "
                          "device by the judge's margin), and none ran here")
            if slower:
                k.state, k.note = "slower", slower
                log.info("kernelsmith: kernel %s for %s not served on %s: %s", k.record.sha256[:12], key[:12],
                         device, slower)
            else:
                k.state, k.note = "passed", how
                timed = (f", {k.race_us[0]:.1f} µs a call against {self.stack}'s own {k.race_us[1]:.1f} µs"
                         if k.race_us else "")
                log.info("kernelsmith: kernel %s for %s passed %s on %s%s", k.record.sha256[:12], key[:12], how,
                         device, timed)
        self.changed()

    def race_kernel(self, k: PackKernel, key: str, device: torch.device, own: Callable[..., Any],
                    at: tuple[Signature, Callable[..., Any]] | None = None) -> str:
        """Time a proven kernel against the stack's own path at its signature (``k.race_us``), or at another one
        with how the kernel runs there (``at``); returns why it is not served where it does not win by the
        margin, else ""."""
        sig, ours = at if at is not None else (spec_signature(k.problem.input_specs), k.call)
        if isinstance(own, OnCopies):
            ours = OnCopies(ours, own.positions)
        try:
            with racing_now():
                ours_us, theirs_us = race(ours, own, random_inputs(sig, device), device)
        except Exception as e:  # noqa: BLE001 - the race decides speed only; the kernel passed its check
            log.warning("kernelsmith: kernel %s for %s served untimed: timing it against %s's own path failed "
                        "(%s: %s)", k.record.sha256[:12], key[:12], self.stack, type(e).__name__, e)
            return ""
        if at is None:
            k.race_us = (ours_us, theirs_us)
        if wins(ours_us, theirs_us, self.margin):
            return ""
        return f"{ours_us:.1f} µs a call against {self.stack}'s own {theirs_us:.1f} µs (margin {self.margin:g})"

    def changed(self) -> None:
        """A kernel's state changed: every served op decides its signatures again."""
        with self._lock:
            self.epoch += 1

    def hit_counter(self, op: str) -> Callable[[], object]:
        """What a served call of ``op`` calls to count a hit: the ``__next__`` of an ``itertools.count``, which
        advances in one step under the interpreter's lock (a lock and a ``Counter`` would add about a third of a
        microsecond to every served call)."""
        with self._lock:
            return self._hits.setdefault(op, itertools.count()).__next__

    @property
    def hits(self) -> dict[str, int]:
        """Served calls so far, by op."""
        with self._lock:
            counts = dict(self._hits)
        # An itertools.count shows its next value, and only in its repr: "count(12)".
        return {op: int(repr(c)[len("count("):-1]) for op, c in counts.items()}

    def count_fallback(self, op: str, reason: str) -> None:
        with self._lock:
            self.fallbacks[(op, reason)] += 1

    def stats(self) -> dict[str, Any]:
        hits = {op: n for op, n in self.hits.items() if n}
        with self._lock:
            fb: dict[str, dict[str, int]] = {}
            for (op, why), n in sorted(self.fallbacks.items()):
                fb.setdefault(op, {})[why] = n
            races = {k[:12]: [_rounded(pk.race_us) for pk in v] for k, v in self.kernels.items()
                     if any(pk.race_us for pk in v)}
            return {"hits": dict(sorted(hits.items())), "fallbacks": fb,
                    "kernels": {k[:12]: [pk.state for pk in v] for k, v in self.kernels.items()},
                    "race_us": races,
                    # signatures other than its problem's (free dims, other layouts), by kernel: how many were
                    # proven there, how many refused
                    "signatures": {k[:12]: [[sum(not p.why for p in pk.at.values()),
                                             sum(bool(p.why) for p in pk.at.values())] for pk in v]
                                   for k, v in self.kernels.items() if any(pk.at for pk in v)},
                    # how each kernel runs at its problem's signature: its judged plan, or why its forward
                    "judged": {k[:12]: ["judged plan" if pk.judged is not None else pk.judged_note for pk in v]
                               for k, v in self.kernels.items() if any(pk.judged is not None or pk.judged_note
                                                                       for pk in v)},
                    "plans": {k[:12]: [f"planned, {pk.plan.launcher()}" if pk.plan is not None else pk.plan_note
                                       for pk in v]
                              for k, v in self.kernels.items() if any(pk.plan is not None or pk.plan_note
                                                                      for pk in v)}}


def _rounded(race_us: tuple[float, float] | None) -> list[float] | None:
    return [round(t, 1) for t in race_us] if race_us else None


def empty_stats() -> dict[str, Any]:
    """``PackGuard.stats()`` where nothing is served."""
    return {"hits": {}, "fallbacks": {}, "kernels": {}, "race_us": {}, "signatures": {}, "judged": {}, "plans": {}}


class StackState:
    """What a stack's integration did in this process: its guard, why it refused (empty when it did not), and the
    ops it serves by layer configuration."""

    def __init__(self) -> None:
        self.guard: PackGuard | None = None
        self.refused = ""
        self.served: dict[tuple, ServedOp] = {}
        self.lock = threading.Lock()

    def stats(self) -> dict[str, Any]:
        return self.guard.stats() if self.guard is not None else empty_stats()

    def served_op(self, op: str, group: tuple, reference: Any, arity: int, own: Any = None) -> ServedOp | None:
        """The op a layer of this configuration (``group``) serves, bound once per configuration; None when
        nothing is served in this process. ``own`` is the stack's own path for it (``PackGuard.bind``)."""
        if self.guard is None:
            return None
        with self.lock:
            served = self.served.get((op, group))
            if served is None:
                served = self.guard.bind(op, key_function(Binding(op, reference, group)), reference, arity, own)
                self.served[(op, group)] = served
                if served:
                    log.info("kernelsmith: %s %s %s serves pack kernels for %d signatures", self.guard.stack, op,
                             group, len(served.table))
            return served


# ============================================================================================ loading


def admit(stack: str, version: str | None, known: tuple[tuple[int, ...], tuple[int, ...]],
          pack: str | os.PathLike[str] | None = None, *, db: str | None = None,
          trust_keys: list[str] | None = None, need_pack: bool = False) -> tuple[PackGuard | None, str]:
    """What every integration checks before it swaps anything, in this order: a pack named (``need_pack``: entry
    points, which a stack loads in every process, do nothing unless ``KERNELSMITH_PACK`` is set), the kill switch,
    a stack version the integration knows, and the pack verified for this machine. Returns (guard, "") or (None,
    why nothing is served)."""
    if need_pack and pack is None and db is None and not Settings.read("pack"):
        return None, f"no pack given (set {ENV_PACK})"
    if disabled():
        return None, f"{ENV_DISABLE}=1"
    if not version_known(stack, version, *known):
        return None, f"{stack} {version} is not a known version"
    return load_guard(stack, pack, db=db, trust_keys=trust_keys)


def load_guard(stack: str, pack: str | os.PathLike[str] | None = None, *, db: str | None = None,
               trust_keys: list[str] | None = None, fingerprint: Any = None) -> tuple[PackGuard | None, str]:
    """Verify a pack (``pack``, else ``KERNELSMITH_PACK``; or the verified kernels of kernel cache ``db``) for this
    machine. Returns (guard, "") or (None, why nothing is served); a refusal is logged on one line."""
    if disabled():
        return None, f"{ENV_DISABLE}=1"
    trust_keys = trust_keys if trust_keys is not None else trusted_keys_from_env()
    if fingerprint is None:
        from ks_inductor.compiler.backend import current_fingerprint

        fingerprint = current_fingerprint()
    tmp_dir = None
    try:
        if pack is None and db is not None:
            tmp_dir = tempfile.TemporaryDirectory(prefix="ks-serve-")
            try:
                pack = _pack_from_store(db, Path(tmp_dir.name) / "cache.kspack", fingerprint)
            except Exception as e:  # noqa: BLE001 - an empty or unreadable cache serves nothing
                log.error("kernelsmith: kernel cache %s not served: %s; %s keeps its own kernels", db, e, stack)
                return None, f"kernel cache not served: {e}"
        pack = pack if pack is not None else Settings.read("pack")
        if pack is None:
            return None, f"no pack given (set {ENV_PACK})"
        return _verified(stack, str(pack), trust_keys, fingerprint)
    finally:
        if tmp_dir is not None:
            tmp_dir.cleanup()


def _pack_from_store(db: str, path: Path, fingerprint: Any) -> Path:
    """A kernel cache served like a pack: its verified kernels for this hardware, exported with golden vectors,
    so both go through one verification."""
    from kernel_cache.access import open_store
    from kernel_cache.pack import ExportFilters, export_pack

    with open_store(db, create=False) as store:
        export_pack(store, path, ExportFilters(fingerprint=fingerprint.hardware_id))
    return path


def _verified(stack: str, path: str, trust_keys: list[str] | None, fingerprint: Any) -> tuple[PackGuard | None, str]:
    from ks_inductor.judge.packs import check_pack

    try:
        report, contents = check_pack(path, trust_keys, fingerprint)
    except Exception as e:  # noqa: BLE001 - a bad key file or a missing signing library refuses, never crashes
        report, contents = None, None
        why = f"{type(e).__name__}: {e}"
    else:
        why = "" if contents is not None else report.reasons[0] if report.reasons else "refused"
        if contents is not None and not contents.kernels:
            contents, why = None, "the pack holds no kernels"
    if contents is None:
        more = len(report.reasons) - 1 if report is not None else 0
        log.error("kernelsmith: pack %s refused: %s%s; %s keeps its own kernels", path, why,
                  f" (+{more} more)" if more > 0 else "", stack)
        return None, f"pack refused: {why}"
    for w in report.warnings:
        log.info("kernelsmith: pack %s: %s", path, w)
    return PackGuard(stack, path, report, contents, fingerprint), ""
