"""The guard every serving integration shares: a pack verified on load, kernels proven on the target device before
first use, and a per-call check that sends anything a kernel was not verified for to the stack's own path.

Configuration a deployment sets (no code in the user's program):

* ``KERNELSMITH_PACK``: the pack to serve from.
* ``KERNELSMITH_TRUSTED_KEYS``: comma-separated ed25519 public keys (files, or base64/hex of the raw bytes); when
  set, an unsigned pack or one signed by another key is refused.
* ``KERNELSMITH_DISABLE=1``: serve nothing; every stack keeps its own kernels.
* ``KERNELSMITH_SERVE_RACE`` (``auto``, ``1``, ``0``) and ``KERNELSMITH_SERVE_MARGIN``: whether a kernel that passed
  its device check is timed against the stack's own path for its op before it serves, and by how much it must win.

Verification on load is ``kernel_cache.pack.check_pack`` (zip integrity, every sha256, the signature, the judge's
static rules, the fingerprint fit); the guard adds nothing to it but what only a serving process can do: run each
kernel's golden vectors on the device the layer actually runs on, once, before the kernel's first result is
used. A refused pack is one log line and no swap: a model never stops working because of a pack.

A kernel that computes the right thing can still be slower than the stack's own path (per-call Python and launch
overhead weigh heavily on small ops). With racing on, the first use of a kernel times it against the stack's own
path for that op (``own``: what the stack would have run, not the traceable ``reference``) on the device, at the
kernel's signature, and the kernel serves only where it is faster by the margin; otherwise every call at that
signature runs the stack's own path, counted as ``R_SLOWER``.

A kernel serves exactly the input signatures its problem was verified for (shape, dtype and stride of every
input, on the pack's device type). Matching a layer to a pack problem is the caller's part (``integrations.ops``):
it traces the layer's own computation at a problem's input signature and compares canonical keys, so a kernel
serves a layer only where the two compute the same aten graph.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernel_cache.settings import VARIABLES, Settings

from .ops import Binding, key_function
from .signature import (
    FreeDims,
    Signature,
    along_free_dims,
    dtype_named,
    free_bucket,
    random_inputs,
    spec_signature,
)

log = logging.getLogger("kernelsmith.integrations")

# The variables these settings come from (kernel_cache.settings documents each), for messages and tests.
ENV_PACK = VARIABLES["pack"].env
ENV_TRUSTED_KEYS = VARIABLES["trusted_keys"].env
ENV_DISABLE = VARIABLES["disabled"].env
ENV_SERVE_RACE = VARIABLES["serve_race"].env
ENV_SERVE_MARGIN = VARIABLES["serve_margin"].env
# Every variable a deployment sets for the integrations (a test clears them all to start from none).
SERVING_ENV = (ENV_PACK, ENV_TRUSTED_KEYS, ENV_DISABLE, ENV_SERVE_RACE, ENV_SERVE_MARGIN)

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
R_SLOWER = "slower than the stack's own"
R_SIGNATURE = "failed its check at this signature"

def disabled() -> bool:
    """The kill switch, read on every served call so that it works on a running server too: an unset variable
    costs one environment lookup."""
    raw = os.environ.get(ENV_DISABLE)
    return bool(raw) and bool(VARIABLES["disabled"].parse(raw))


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


# ============================================================================================ kernels


@dataclass
class PackKernel:
    """One pack kernel as it serves: loaded on first use, after its golden vectors pass on the call's device."""

    record: Any  # KernelRecord
    problem: Any  # Problem
    vectors: bytes | None
    state: str = "unchecked"  # unchecked | passed | failed | none | slower | broken
    note: str = ""
    loaded: Any = None  # kernel_ops.LoadedKernel
    race_us: tuple[float, float] | None = None  # median µs per call: (ours, the stack's own), where it was raced
    # Its launches replayed without its Python forward (``launch_plan``), made once it passed its check on a GPU;
    # None where it has none (``plan_note`` says why).
    plan: Any = None
    plan_note: str = ""
    # Signatures other than its problem's, along the op's free dims (``PackGuard.bind``), where it was proven
    # against the stack's own computation once: what a call there runs.
    at: dict[Signature, SignatureProof] = field(default_factory=dict)
    # Whether it beat the stack's own path, by bucket of its free dims' sizes (powers of two): "" where it did,
    # else why not. Its problem's own signature fills the bucket it falls in.
    bucket_races: dict[tuple[int, ...], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, *args: Any) -> Any:
        """The kernel's outputs for ``args``: through its launch plan where it has one, else its forward."""
        return _launch(self.plan, self.loaded.model, args)


@dataclass
class SignatureProof:
    """A pack kernel at a signature its problem does not have (another length along a free dim): whether it
    computed what the stack computes there (``why`` empty), the outputs it must return, and how it launches."""

    kernel: PackKernel
    why: str
    outputs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    plan: Any = None

    def call(self, *args: Any) -> Any:
        return _launch(self.plan, self.kernel.loaded.model, args)


def _launch(plan: Any, forward: Callable[..., Any], args: tuple) -> Any:
    """A kernel's outputs: replayed from its launch plan, or from its forward where it has none or the plan
    declines this call (a pointer no longer aligned as it was specialized)."""
    if plan is not None:
        out = plan(*args)
        if out is not None:
            return out
    return forward(*args)


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
    trials = stack_trials(device, reference, sig, n)
    if isinstance(trials, str):
        return False, trials
    why = _check(kernel, trials)
    return not why, why


def stack_trials(device: torch.device, reference: Callable[..., Any], sig: Signature,
                 n: int = 2) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]] | str:
    """``n`` sets of seeded random inputs at ``sig`` with the stack's own outputs for them; why not, where the
    stack's computation raises there."""
    gen = torch.Generator(device=device).manual_seed(0)
    trials = []
    for _ in range(n):
        ins = random_inputs(sig, device, gen)
        try:
            with torch.no_grad():
                ref = [o for o in _as_list(reference(*[x.clone() for x in ins])) if isinstance(o, torch.Tensor)]
        except Exception as e:  # noqa: BLE001 - a signature the stack itself cannot compute is never served
            return f"the stack's own computation raised: {type(e).__name__}: {e}"
        trials.append((ins, ref))
    return trials


# ============================================================================================ racing


class OnCopies:
    """A stack path that writes into some of its inputs (a fused residual add done in place), callable as an
    ``own`` path, which must leave its inputs as they were: ``fn`` runs on copies of the inputs at ``positions``. A
    race gives our kernel the same copies, so both sides pay the same copying (which only ever favours the
    stack's path under the margin)."""

    def __init__(self, fn: Callable[..., Any], positions: Sequence[int]) -> None:
        self.fn = fn
        self.positions = tuple(positions)

    def __call__(self, *args: Any) -> Any:
        args_ = list(args)
        for i in self.positions:
            args_[i] = args_[i].clone()
        return self.fn(*args_)


# Set while this thread times a stack's own path. Some own paths dispatch back through the layer's replaced forward
# (vLLM's and SGLang's RMSNorm.forward_cuda call self.forward_native): such a call runs the stack's own code,
# uncounted, instead of proving the kernel being raced again.
_RACING = threading.local()


def _racing() -> bool:
    return getattr(_RACING, "on", False)


def racing_on(device_type: str) -> bool:
    """``KERNELSMITH_SERVE_RACE``: ``auto`` races on a GPU only, since under the Triton interpreter (CPU tensors)
    a kernel's time says nothing about the kernel."""
    mode = Settings.read("serve_race")
    return device_type != "cpu" if mode == "auto" else mode == "1"


def serve_margin() -> float:
    """``KERNELSMITH_SERVE_MARGIN``; a value that is not a number is the default, with a warning (a pack never
    stops a model from loading)."""
    try:
        return float(Settings.read("serve_margin"))
    except ValueError:
        default = Settings().serve_margin
        log.warning("kernelsmith: %s=%r is not a number; racing with a margin of %g", ENV_SERVE_MARGIN,
                    os.environ.get(ENV_SERVE_MARGIN), default)
        return default


def wins(ours_us: float, theirs_us: float, margin: float) -> bool:
    """Whether our kernel serves: its median time times ``margin`` is no more than the stack's own."""
    return ours_us * margin <= theirs_us


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _time_batch(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], n: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    sync()
    return (time.perf_counter() - start) / n


def race(ours: Callable[..., Any], theirs: Callable[..., Any], inputs: Sequence[torch.Tensor],
         device: torch.device, *, rounds: int = 5, calls: int = 20, budget_s: float = 0.05) -> tuple[float, float]:
    """Median µs per call of ``ours(*inputs)`` and ``theirs(*inputs)`` on ``device``.

    Both warm up first (a stack's Triton kernel compiles on its first call). Then interleaved rounds, the order
    alternating so that neither side always follows the other, each side a batch of calls with the device
    synchronized around it; caches stay warm between calls, as in serving. A batch holds fewer calls (down to one)
    where calls are slow, so that a race takes about ``budget_s``."""
    from ks_inductor.judge import device_lock

    sync = _synchronizer(device)
    sides = (ours, theirs)
    # On a GPU the race holds the device alone against every kernelsmith process (a judge's timing, a warm), as
    # the judge does to time.
    alone = device_lock.exclusive(device.index) if device.type == "cuda" else contextlib.nullcontext()
    with alone, torch.no_grad():
        for fn in sides:
            _time_batch(fn, inputs, 2, sync)
        once = sum(_time_batch(fn, inputs, 1, sync) for fn in sides)
        n = max(1, min(calls, int(budget_s / max(rounds * once, 1e-9))))
        times: tuple[list[float], list[float]] = ([], [])
        for r in range(rounds):
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[side].append(_time_batch(sides[side], inputs, n, sync))
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


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
        cache length). Each such signature is proven once against ``reference`` on random inputs before a call
        there is served, and raced once per power-of-two bucket of those sizes; a kernel that bakes in its
        problem's sizes fails that proof, and the stack's own path runs there."""
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
        return ServedOp(self, op, table, reference, own, free if reference is not None else ())

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
                    k.plan, k.plan_note = make_plan(k.loaded.model, random_inputs(sig, device))
                    log.info("kernelsmith: kernel %s for %s %s", k.record.sha256[:12], key[:12],
                             "launches without its forward" if k.plan is not None
                             else f"keeps its forward: {k.plan_note}")
            # The state is set once the race is over: a kernel another thread sees "passed" has won it.
            slower = self._race(k, key, device, own) if self.race and own is not None else ""
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

    def _race(self, k: PackKernel, key: str, device: torch.device, own: Callable[..., Any],
              at: tuple[Signature, Callable[..., Any]] | None = None) -> str:
        """Time a proven kernel against the stack's own path at its signature (``k.race_us``), or at another one
        with how the kernel runs there (``at``); returns why it is not served where it does not win by the
        margin, else ""."""
        sig, ours = at if at is not None else (spec_signature(k.problem.input_specs), k.call)
        if isinstance(own, OnCopies):
            ours = OnCopies(ours, own.positions)
        _RACING.on = True
        try:
            ours_us, theirs_us = race(ours, own, random_inputs(sig, device), device)
        except Exception as e:  # noqa: BLE001 - the race decides speed only; the kernel passed its check
            log.warning("kernelsmith: kernel %s for %s served untimed: timing it against %s's own path failed "
                        "(%s: %s)", k.record.sha256[:12], key[:12], self.stack, type(e).__name__, e)
            return ""
        finally:
            _RACING.on = False
        if at is None:
            k.race_us = (ours_us, theirs_us)
        if wins(ours_us, theirs_us, self.margin):
            return ""
        return f"{ours_us:.1f} µs a call against {self.stack}'s own {theirs_us:.1f} µs (margin {self.margin:g})"

    def changed(self) -> None:
        """A kernel's state changed: every served op decides its signatures again."""
        with self._lock:
            self.epoch += 1

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
            races = {k[:12]: [_rounded(pk.race_us) for pk in v] for k, v in self.kernels.items()
                     if any(pk.race_us for pk in v)}
            return {"hits": dict(sorted(self.hits.items())), "fallbacks": fb,
                    "kernels": {k[:12]: [pk.state for pk in v] for k, v in self.kernels.items()},
                    "race_us": races,
                    # signatures along free dims, by kernel: how many were proven there, how many refused
                    "signatures": {k[:12]: [[sum(not p.why for p in pk.at.values()),
                                             sum(bool(p.why) for p in pk.at.values())] for pk in v]
                                   for k, v in self.kernels.items() if any(pk.at for pk in v)},
                    "plans": {k[:12]: ["planned" if pk.plan is not None else pk.plan_note for pk in v]
                              for k, v in self.kernels.items() if any(pk.plan is not None or pk.plan_note
                                                                      for pk in v)}}


def _rounded(race_us: tuple[float, float] | None) -> list[float] | None:
    return [round(t, 1) for t in race_us] if race_us else None


def empty_stats() -> dict[str, Any]:
    """``PackGuard.stats()`` where nothing is served."""
    return {"hits": {}, "fallbacks": {}, "kernels": {}, "race_us": {}, "signatures": {}, "plans": {}}


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


class _Route:
    """What a call at one signature (with its inputs' devices) does, decided on the first such call: ``early``, a
    reason counted before the autograd check (another device); ``late``, one counted after it (a signature no
    kernel was verified for); else the kernel for ``key``, settled at guard ``epoch`` and redone when any kernel's
    state changes. ``checked``: the kernel's outputs at this signature were validated once. ``sig``: the call's
    signature, where it is not ``key``'s problem's but lies along the op's free dims."""

    __slots__ = ("early", "late", "key", "device", "epoch", "kernel", "why", "checked", "sig", "proof")

    def __init__(self, early: str, late: str, key: str | None, device: torch.device,
                 sig: Signature | None = None) -> None:
        self.early, self.late, self.key, self.device = early, late, key, device
        self.epoch = -1
        self.kernel: PackKernel | None = None
        self.why = ""
        self.checked = False
        # Set where the call's signature is not the problem's but lies along the op's free dims: the kernel's
        # proof there, which runs it.
        self.sig = sig
        self.proof: SignatureProof | None = None


# Routes a served op keeps: far more than the signatures a pack holds; a server cycling through more starts over.
_MAX_ROUTES = 4096


class ServedOp:
    """One op of one layer kind: ``op(*tensors)`` returns the kernel's result (a tensor, or a tuple where the op has
    several outputs), or None where the caller must run its own path (the reason is counted)."""

    def __init__(self, guard: PackGuard, name: str, table: dict[Signature, str],
                 reference: Callable[..., Any] | None = None, own: Callable[..., Any] | None = None,
                 free: FreeDims = ()) -> None:
        self.guard = guard
        self.name = name
        self.table = table
        self.reference = reference
        self.own = own if own is not None else reference
        self.free = tuple(free)
        self._routes: dict[tuple, _Route] = {}
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
        known = list(self.table)
        if not any(tuple(a[1] for a in k) == tuple(a[1] for a in sig) for k in known):
            return R_DTYPE
        if any(tuple(a[0] for a in k) == tuple(a[0] for a in sig) for k in known):
            return R_STRIDE
        return R_SHAPE

    def _route(self, key: tuple, args: Sequence[torch.Tensor]) -> _Route:
        device = args[0].device
        if device.type != self.guard.device_type or any(k[3] != device for k in key):
            route = _Route(R_DEVICE, "", None, device)
        else:
            sig = tuple((tuple(shape), dt, tuple(stride)) for shape, dt, stride, _ in key)
            problem = self.table.get(sig)
            if problem is not None:
                route = _Route("", "", problem, device)
            else:
                along = next((k for s, k in self.table.items() if along_free_dims(self.free, s, sig)), None)
                route = (_Route("", "", along, device, sig) if along is not None
                         else _Route("", self._reason(sig), None, device))
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        self._routes[key] = route
        return route

    def _settle(self, route: _Route) -> None:
        g = self.guard
        epoch = g.epoch  # read first: a change while the kernel is proven settles the route again
        kernel = g.ready_kernel(route.key, route.device, self.reference, self.own)
        proof, why = None, ""
        if kernel is not None and route.sig is not None:
            proof = self._proof_at(kernel, route.sig, route.device)
            why = R_SIGNATURE if proof.why else self._bucket_race(kernel, route.sig, route.device, proof)
            if why:
                kernel = None
        if kernel is not route.kernel or proof is not route.proof:
            route.kernel, route.proof, route.checked = kernel, proof, False
        if kernel is None:
            states = {k.state for k in g.kernels.get(route.key, [])}
            route.why = why or (R_NO_VECTORS if states == {"none"} else R_SLOWER if "slower" in states
                                else R_VECTORS)
        route.epoch = epoch

    def _proof_at(self, kernel: PackKernel, sig: Signature, device: torch.device) -> SignatureProof:
        """The kernel at a signature along the free dims, proven once against the stack's own computation on
        random inputs there, with a launch plan of its own on a GPU."""
        with kernel.lock:
            proof = kernel.at.get(sig)
            if proof is not None:
                return proof
            trials = stack_trials(device, self.reference, sig) if self.reference is not None else "no reference"
            why = trials if isinstance(trials, str) else _load(kernel) or _check(kernel, trials)
            proof = SignatureProof(kernel, why)
            if not why:
                proof.outputs = [(tuple(o.shape), o.dtype) for o in trials[0][1]]
                if device.type == "cuda":
                    from .launch_plan import make_plan

                    proof.plan, _ = make_plan(kernel.loaded.model, random_inputs(sig, device))
            else:
                log.info("kernelsmith: kernel %s does not serve %s at %s: %s", kernel.record.sha256[:12],
                         self.name, [list(a[0]) for a in sig], why)
            if len(kernel.at) >= _MAX_ROUTES:
                kernel.at.clear()  # a server cycling through more lengths proves them again
            kernel.at[sig] = proof
            return proof

    def _bucket_race(self, kernel: PackKernel, sig: Signature, device: torch.device,
                     proof: SignatureProof) -> str:
        """"" where the kernel beats the stack's own path in the power-of-two bucket of ``sig``'s free dims (raced
        there once; its problem's own bucket is the race it already won), else the reason counted."""
        g = self.guard
        if not g.race or self.own is None:
            return ""
        with kernel.lock:
            own_sig = spec_signature(kernel.problem.input_specs)
            if own_sig is not None:
                kernel.bucket_races.setdefault(free_bucket(self.free, own_sig), "")
            bucket = free_bucket(self.free, sig)
            if bucket not in kernel.bucket_races:
                kernel.bucket_races[bucket] = g._race(kernel, kernel.problem.key, device, self.own,
                                                      at=(sig, proof.call))
            return R_SLOWER if kernel.bucket_races[bucket] else ""

    def _outputs_fit(self, route: _Route, outs: list[Any]) -> bool:
        if route.proof is not None:
            expected = route.proof.outputs
        else:
            expected = [(tuple(spec.shape or ()), dtype_named(spec.dtype or ""))
                        for spec in route.kernel.problem.output_specs]
        if len(outs) != len(expected) or not expected:
            return False
        return all(isinstance(out, torch.Tensor) and tuple(out.shape) == shape and out.dtype == dt
                   and out.device == route.device for out, (shape, dt) in zip(outs, expected))

    def _broken(self, kernel: PackKernel, e: Exception) -> None:
        with kernel.lock:
            kernel.state, kernel.note = "broken", f"{type(e).__name__}: {e}"
        self.guard.changed()
        log.warning("kernelsmith: kernel %s raised at run time (%s); %s computes %s itself from now on",
                    kernel.record.sha256[:12], kernel.note, self.guard.stack, self.name)

    def __call__(self, *args: Any) -> Any:
        # The hot path: every check that depends only on the inputs' signature is decided once per signature
        # (a route); what remains per call is the kill switch, one key built and one dict lookup.
        if disabled():
            return self._miss(R_DISABLED)
        for a in args:
            if not isinstance(a, torch.Tensor):
                return self._miss(R_CALL)
        if not args:
            return self._miss(R_CALL)
        if args[0].shape not in self._first_shapes:
            return self._miss(R_SHAPE)
        key = tuple([(a.shape, a.dtype, a.stride(), a.device) for a in args])
        route = self._routes.get(key) or self._route(key, args)
        if route.early:
            return self._miss(route.early)
        grad = torch.is_grad_enabled()
        if grad:
            for a in args:
                if a.requires_grad:
                    return self._miss(R_GRAD)  # kernels serve inference: no backward through them
        if route.late:
            return self._miss(route.late)
        if route.epoch != self.guard.epoch:
            if _racing():
                return None  # a stack's own path, timed in a race, came back through its layer: its own code runs
            self._settle(route)
        kernel, proof = route.kernel, route.proof
        if kernel is None:
            return self._miss(route.why)
        run = kernel.call if proof is None else proof.call
        try:
            if grad:
                with torch.no_grad():
                    out = run(*args)
            else:
                out = run(*args)
        except Exception as e:  # noqa: BLE001 - never a broken model: the stack computes it instead
            self._broken(kernel, e)
            return self._miss(R_ERROR)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not route.checked:
            if not self._outputs_fit(route, list(outs)):
                return self._miss(R_OUTPUT)
            route.checked = True
        self.guard.count_hit(self.name)
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
