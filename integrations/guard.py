"""The guard every serving integration shares: a pack verified on load, kernels proven on the target device before
first use, and a per-call check that sends anything a kernel was not verified for to the stack's own path.

Configuration a deployment sets (no code in the user's program):

* ``KERNELSMITH_PACK``: the pack to serve from.
* ``KERNELSMITH_TRUSTED_KEYS``: comma-separated ed25519 public keys (files, or base64/hex of the raw bytes); when
  set, an unsigned pack or one signed by another key is refused.
* ``KERNELSMITH_DISABLE=1``: serve nothing; every stack keeps its own kernels.

Verification on load is ``kernel_cache.pack.check_pack`` (zip integrity, every sha256, the signature, the judge's
static rules, the fingerprint fit); the guard adds nothing to it but what only a serving process can do: run each
kernel's golden vectors on the device the layer actually runs on, once, before the kernel's first result is
used. A refused pack is one log line and no swap: a model never stops working because of a pack.

A kernel serves exactly the input signatures its problem was verified for (shape, dtype and stride of every
input, on the pack's device type). Matching a layer to a pack problem is the caller's part (``integrations.ops``):
it traces the layer's own computation at a problem's input signature and compares canonical keys, so a kernel
serves a layer only where the two compute the same aten graph.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernel_cache.settings import VARIABLES, Settings

log = logging.getLogger("kernelsmith.integrations")

# The variables these settings come from (kernel_cache.settings documents each), for messages and tests.
ENV_PACK = VARIABLES["pack"].env
ENV_TRUSTED_KEYS = VARIABLES["trusted_keys"].env
ENV_DISABLE = VARIABLES["disabled"].env

# Fallback reasons, as counted.
R_DISABLED = "disabled"
R_DEVICE = "device"
R_DTYPE = "dtype"
R_SHAPE = "shape"
R_STRIDE = "stride"
R_CALL = "call form"
R_VECTORS = "failed its device check"
R_NO_VECTORS = "no golden vectors"
R_ERROR = "kernel error"
R_OUTPUT = "bad output"
R_GRAD = "autograd"

Signature = tuple[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]], ...]


def disabled() -> bool:
    return bool(Settings.read("disabled"))  # read on every served call: the switch works on a running server too


def trusted_keys_from_env() -> list[str] | None:
    raw = Settings.read("trusted_keys")
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    return keys or None


def parse_version(text: str) -> tuple[int, ...]:
    """``5.24.0.dev0+local`` -> (5, 24, 0): the leading numeric release, enough to compare against known ranges."""
    parts = []
    for piece in text.split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


def version_known(stack: str, version: str | None, lowest: tuple[int, ...], below: tuple[int, ...]) -> bool:
    """Whether ``version`` lies in [lowest, below); otherwise warn once and say the stack keeps its own path.

    The integrations patch layer internals a stack may change in any release: a version nobody checked is served
    by the stack itself rather than risk a wrong swap."""
    parsed = parse_version(version or "")
    if parsed and lowest <= parsed < below:
        return True
    span = f"{'.'.join(map(str, lowest))} <= version < {'.'.join(map(str, below))}"
    log.warning("kernelsmith: %s %s is not a version this integration knows (%s); %s keeps its own kernels",
                stack, version or "(unknown)", span, stack)
    return False


def _dtype(name: str) -> torch.dtype | None:
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


def spec_signature(specs: Sequence[Any]) -> Signature | None:
    """The signature a problem's input specs describe; None when an input is not a tensor of a known dtype."""
    out = []
    for s in specs:
        dt = _dtype(s.dtype or "") if s.kind == "tensor" else None
        if dt is None:
            return None
        out.append((tuple(s.shape or ()), dt, tuple(s.stride or ())))
    return tuple(out)


def call_signature(args: Sequence[torch.Tensor]) -> Signature:
    return tuple((tuple(a.shape), a.dtype, tuple(a.stride())) for a in args)


def meta_inputs(sig: Signature) -> list[torch.Tensor]:
    """Tensors of a signature with no memory behind them, for tracing a reference at that signature."""
    return [torch.empty_strided(shape, stride, dtype=dt, device="meta") for shape, dt, stride in sig]


# ============================================================================================ kernels


@dataclass
class PackKernel:
    """One pack kernel as it serves: loaded on first use, after its golden vectors pass on the call's device."""

    record: Any  # KernelRecord
    problem: Any  # Problem
    vectors: bytes | None
    state: str = "unchecked"  # unchecked | passed | failed | none | broken
    note: str = ""
    loaded: Any = None  # kernel_ops.LoadedKernel
    lock: threading.Lock = field(default_factory=threading.Lock)


def _rank(ke: dict[str, Any]) -> float:
    sp = ke.get("speedup")
    return float(sp) if isinstance(sp, (int, float)) else 0.0


def _tolerance(dtype: str) -> tuple[float, float]:
    from ks_inductor.judge.config import JudgeConfig

    return JudgeConfig().tolerance(dtype)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _load(kernel: PackKernel) -> str:
    from ks_inductor.compiler import kernel_ops as ko

    if kernel.loaded is None:
        try:
            kernel.loaded = ko.load_kernel(kernel.record)
        except ko.KernelLoadError as e:
            return f"cannot load: {e}"
    return ""


def _check(kernel: PackKernel, trials: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> str:
    from ks_inductor.judge.compare import compare_outputs

    for i, (ins, ref) in enumerate(trials):
        try:
            with torch.no_grad():
                got = [o.detach().to("cpu") for o in _as_list(kernel.loaded.model(*ins)) if isinstance(o, torch.Tensor)]
        except Exception as e:  # noqa: BLE001 - a kernel that raises on its own check is not served
            return f"trial {i}: {type(e).__name__}: {e}"
        _, why = compare_outputs([r.to("cpu") for r in ref], got, _tolerance, i, "golden")
        if why:
            return why
    return ""


def run_golden_vectors(kernel: PackKernel, device: torch.device) -> tuple[bool, str]:
    """Run the kernel on its golden inputs on ``device`` and compare with the reference outputs the pack carries."""
    from kernel_cache.pack import golden_inputs

    if kernel.vectors is None:
        return False, R_NO_VECTORS
    _, vectors, _ = golden_inputs(kernel.vectors)
    if not vectors:
        return False, R_NO_VECTORS
    why = _load(kernel)
    if why:
        return False, why
    trials = [([x.to(device) for x in ins], outs) for ins, outs in vectors]
    why = _check(kernel, trials)
    return not why, why


def run_against_stack(kernel: PackKernel, device: torch.device, reference: Callable[..., Any],
                      n: int = 2) -> tuple[bool, str]:
    """For a kernel whose problem was too large for golden vectors: seeded random inputs at its signature, on
    ``device``, compared with the stack's own computation of the op (the layer's code, not the pack's)."""
    sig = spec_signature(kernel.problem.input_specs)
    if sig is None:
        return False, R_NO_VECTORS
    why = _load(kernel)
    if why:
        return False, why
    gen = torch.Generator(device=device).manual_seed(0)
    trials = []
    for _ in range(n):
        ins = [torch.empty_strided(shape, stride, dtype=dt, device=device).normal_(generator=gen)
               if dt.is_floating_point else torch.empty_strided(shape, stride, dtype=dt, device=device).random_(
                   0, 16, generator=gen) for shape, dt, stride in sig]
        with torch.no_grad():
            ref = [o for o in _as_list(reference(*[x.clone() for x in ins])) if isinstance(o, torch.Tensor)]
        trials.append((ins, ref))
    why = _check(kernel, trials)
    return not why, why


# ============================================================================================ the guard


class PackGuard:
    """A verified pack inside a serving stack: its kernels by problem key, and the hit and fallback counters."""

    def __init__(self, stack: str, path: str, report: Any, contents: Any, fingerprint: Any) -> None:
        from kernel_cache.fingerprint import BACKEND_CPU_INTERPRET

        self.stack = stack
        self.path = path
        self.report = report
        self.fingerprint = fingerprint
        # The interpreter runs kernels on CPU tensors; every other backend on the GPU (MetaX included: torch
        # calls its devices cuda).
        self.device_type = "cpu" if fingerprint.backend == BACKEND_CPU_INTERPRET else "cuda"
        self.problems = {p.key: p for p in contents.problems}
        ranked = sorted(zip(contents.manifest["kernels"], contents.kernels), key=lambda kr: -_rank(kr[0]))
        self.kernels: dict[str, list[PackKernel]] = {}
        for _, rec in ranked:
            p = self.problems.get(rec.problem_key)
            if p is not None:
                self.kernels.setdefault(rec.problem_key, []).append(
                    PackKernel(rec, p, contents.vectors.get(rec.problem_key)))
        self.hits: Counter[str] = Counter()
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------- binding

    def bind(self, op: str, key_of: Callable[[Signature], str | None],
             reference: Callable[..., Any] | None = None, arity: int | None = None) -> ServedOp:
        """The pack kernels that compute ``op`` as the caller's ``reference`` does: ``key_of(signature)`` is the
        canonical key of that computation at a signature (None when it cannot be traced there); only problems of
        ``arity`` inputs are tried when given. The reference also proves, on the device, a kernel whose problem
        shipped without golden vectors."""
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
        return ServedOp(self, op, table, reference)

    # ---------------------------------------------------------------------------------------- serving

    def ready_kernel(self, key: str, device: torch.device,
                     reference: Callable[..., Any] | None = None) -> PackKernel | None:
        """The best kernel for ``key`` proven on ``device``: by the pack's golden vectors, or where the problem has
        none, against ``reference`` (the stack's own computation). Each kernel is proven once, before first use."""
        for k in self.kernels.get(key, []):
            if k.state == "passed":
                return k
            if k.state not in ("unchecked", "none") or (k.state == "none" and reference is None):
                continue
            with k.lock:
                if k.state == "unchecked" or (k.state == "none" and reference is not None):
                    ok, why = run_golden_vectors(k, device)
                    how = "its golden vectors"
                    if why == R_NO_VECTORS and reference is not None:
                        ok, why = run_against_stack(k, device, reference)
                        how = f"a check against {self.stack}'s own computation"
                    k.state, k.note = ("passed", how) if ok else ("none" if why == R_NO_VECTORS else "failed", why)
                    if ok:
                        log.info("kernelsmith: kernel %s for %s passed %s on %s", k.record.sha256[:12], key[:12],
                                 how, device)
                    else:
                        log.warning("kernelsmith: kernel %s for %s not served: %s", k.record.sha256[:12],
                                    key[:12], why)
            if k.state == "passed":
                return k
        return None

    def count_hit(self, op: str) -> None:
        with self._lock:
            self.hits[op] += 1

    def count_fallback(self, op: str, reason: str) -> None:
        with self._lock:
            self.fallbacks[(op, reason)] += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            fb: dict[str, dict[str, int]] = {}
            for (op, why), n in sorted(self.fallbacks.items()):
                fb.setdefault(op, {})[why] = n
            return {"hits": dict(sorted(self.hits.items())), "fallbacks": fb,
                    "kernels": {k[:12]: [pk.state for pk in v] for k, v in self.kernels.items()}}


def installed_version(module: str) -> str | None:
    """``module.__version__`` of an installed stack, None where it is not importable."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return str(getattr(mod, "__version__", "")) or None


class StackState:
    """What a stack's integration did in this process: its guard, why it refused (empty when it did not), and the
    ops it serves by layer configuration."""

    def __init__(self) -> None:
        self.guard: PackGuard | None = None
        self.refused = ""
        self.served: dict[tuple, ServedOp] = {}
        self.lock = threading.Lock()

    def stats(self) -> dict[str, Any]:
        return self.guard.stats() if self.guard is not None else {"hits": {}, "fallbacks": {}, "kernels": {}}

    def served_op(self, op: str, group: tuple, reference: Any, arity: int) -> ServedOp | None:
        """The op a layer of this configuration (``group``) serves, bound once per configuration; None when
        nothing is served in this process."""
        from .ops import Binding, key_function

        if self.guard is None:
            return None
        with self.lock:
            served = self.served.get((op, group))
            if served is None:
                served = self.guard.bind(op, key_function(Binding(op, reference, group)), reference, arity)
                self.served[(op, group)] = served
            return served


class ServedOp:
    """One op of one layer kind: ``op(*tensors)`` returns the kernel's result (a tensor, or a tuple where the op has
    several outputs), or None where the caller must run its own path (the reason is counted)."""

    def __init__(self, guard: PackGuard, name: str, table: dict[Signature, str],
                 reference: Callable[..., Any] | None = None) -> None:
        self.guard = guard
        self.name = name
        self.table = table
        self.reference = reference
        self._why: dict[Signature, str] = {}
        # Most calls a pack does not cover differ in the first input's shape (another token count): rejecting
        # those on one set lookup keeps the stack's own path nearly as fast as without us.
        self._first_shapes = {sig[0][0] for sig in table}

    def __bool__(self) -> bool:
        return bool(self.table)

    @property
    def signatures(self) -> list[Signature]:
        return list(self.table)

    def _miss(self, reason: str) -> None:
        self.guard.count_fallback(self.name, reason)
        return None

    def _reason(self, sig: Signature) -> str:
        why = self._why.get(sig)
        if why is None:
            known = list(self.table)
            if not any(tuple(a[1] for a in k) == tuple(a[1] for a in sig) for k in known):
                why = R_DTYPE
            elif any(tuple(a[0] for a in k) == tuple(a[0] for a in sig) for k in known):
                why = R_STRIDE
            else:
                why = R_SHAPE
            self._why[sig] = why
        return why

    def __call__(self, *args: Any) -> Any:
        g = self.guard
        if disabled():
            return self._miss(R_DISABLED)
        for a in args:
            if not isinstance(a, torch.Tensor):
                return self._miss(R_CALL)
        if not args:
            return self._miss(R_CALL)
        if tuple(args[0].shape) not in self._first_shapes:
            return self._miss(R_SHAPE)
        device = args[0].device
        if device.type != g.device_type or any(a.device != device for a in args):
            return self._miss(R_DEVICE)
        if torch.is_grad_enabled() and any(a.requires_grad for a in args):
            return self._miss(R_GRAD)  # kernels serve inference: no backward through them
        sig = call_signature(args)
        key = self.table.get(sig)
        if key is None:
            return self._miss(self._reason(sig))
        kernel = g.ready_kernel(key, device, self.reference)
        if kernel is None:
            states = {k.state for k in g.kernels.get(key, [])}
            return self._miss(R_NO_VECTORS if states == {"none"} else R_VECTORS)
        try:
            with torch.no_grad():
                outs = _as_list(kernel.loaded.model(*args))
        except Exception as e:  # noqa: BLE001 - never a broken model: the stack computes it instead
            with kernel.lock:
                kernel.state, kernel.note = "broken", f"{type(e).__name__}: {e}"
            log.warning("kernelsmith: kernel %s raised at run time (%s); %s computes %s itself from now on",
                        kernel.record.sha256[:12], kernel.note, g.stack, self.name)
            return self._miss(R_ERROR)
        expected = kernel.problem.output_specs
        if len(outs) != len(expected) or not expected:
            return self._miss(R_OUTPUT)
        for out, spec in zip(outs, expected):
            if (not isinstance(out, torch.Tensor) or list(out.shape) != list(spec.shape or [])
                    or out.dtype != _dtype(spec.dtype or "") or out.device != device):
                return self._miss(R_OUTPUT)
        g.count_hit(self.name)
        return outs[0] if len(outs) == 1 else tuple(outs)


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
    from kernel_cache.pack import ExportFilters, export_pack
    from ks_inductor.compiler.backend import open_store

    export_pack(open_store(db), path, ExportFilters(fingerprint=fingerprint.hardware_id))
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
