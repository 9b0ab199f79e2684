"""One op of one layer kind as a stack calls it: ``op(*tensors)`` returns a proven pack kernel's result, or None where
the caller must run its own path (the reason counted).

A kernel serves exactly the input signatures its problem was verified for (shape, dtype and stride of every input,
on the pack's device type), and, along an op's free dims (a decode step's cache length) or with its inputs laid
out densely in another order, each other signature once it is proven there against the stack's own computation.
Every check that depends only on a call's signature is decided once per signature (a route), so what remains per
call is the kill switch, one key built and one dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from .checks import PackKernel, SignatureProof, check_trials, launch, plan_at, stack_trials
from .race import racing
from .serving import (
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
    disabled,
)
from .signature import (
    FreeDims,
    Signature,
    dtype_named,
    free_bucket,
    provable_at,
    random_inputs,
    spec_signature,
)

log = logging.getLogger("kernelsmith.integrations")


class KernelSource(Protocol):
    """What a served op asks of its guard (:class:`integrations.guard.PackGuard`): the kernels by problem key and
    their proofs, whether and how to race, and the counters."""

    stack: str
    device_type: str
    race: bool
    epoch: int
    kernels: dict[str, list[PackKernel]]

    def ready_kernel(self, key: str, device: torch.device, reference: Callable[..., Any] | None = None,
                     own: Callable[..., Any] | None = None) -> PackKernel | None: ...

    def race_kernel(self, k: PackKernel, key: str, device: torch.device, own: Callable[..., Any],
                    at: tuple[Signature, Callable[..., Any]] | None = None) -> str: ...

    def changed(self) -> None: ...

    def hit_counter(self, op: str) -> Callable[[], object]: ...

    def count_fallback(self, op: str, reason: str) -> None: ...


class _Route:
    """What a call at one signature (with its inputs' devices) does, decided on the first such call: ``early``, a
    reason counted before the autograd check (another device); ``late``, one counted after it (a signature no
    kernel was verified for); else the kernel for ``key``, settled at guard ``epoch`` and redone when any kernel's
    state changes. ``checked``: the kernel's outputs at this signature were validated once. ``sig``: the call's
    signature, where it is not ``key``'s problem's but one the kernel may be proven at (``provable_at``)."""

    __slots__ = ("early", "late", "key", "device", "epoch", "kernel", "why", "checked", "sig", "proof", "plan",
                 "forward")

    def __init__(self, early: str, late: str, key: str | None, device: torch.device,
                 sig: Signature | None = None) -> None:
        self.early, self.late, self.key, self.device = early, late, key, device
        self.epoch = -1
        self.kernel: PackKernel | None = None
        self.why = ""
        self.checked = False
        # Set where the call's signature is not the problem's but one the kernel may be proven at: the kernel's
        # proof there, which runs it.
        self.sig = sig
        self.proof: SignatureProof | None = None
        # The settled kernel's launch plan here (None where it has none), and what runs where the plan does not.
        self.plan: Any = None
        self.forward: Any = None


# Routes a served op keeps: far more than the signatures a pack holds; a server cycling through more starts over.
_MAX_ROUTES = 4096


class ServedOp:
    """One op of one layer kind: ``op(*tensors)`` returns the kernel's result (a tensor, or a tuple where the op has
    several outputs), or None where the caller must run its own path (the reason is counted)."""

    def __init__(self, guard: KernelSource, name: str, table: dict[Signature, str],
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
        self._hit = guard.hit_counter(name)

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
                along = (next((k for s, k in self.table.items() if provable_at(self.free, s, sig)), None)
                         if self.reference is not None else None)
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
        route.plan = None if kernel is None else kernel.plan if proof is None else proof.plan
        # At the problem's signature the kernel runs as judged; elsewhere as recorded and proven there.
        route.forward = None if kernel is None else kernel.judged_call if proof is None else proof.runs
        if kernel is None:
            states = {k.state for k in g.kernels.get(route.key, [])}
            route.why = why or (R_NO_VECTORS if states == {"none"} else R_SLOWER if "slower" in states
                                else R_VECTORS)
        route.epoch = epoch

    def _proof_at(self, kernel: PackKernel, sig: Signature, device: torch.device) -> SignatureProof:
        """The kernel at a signature other than its problem's: its launches recorded once there (``plan_at``), and
        that record proven against the stack's own computation on random inputs there; what serves is the proven
        record (through a static launcher on a GPU), never the forward."""
        with kernel.lock:
            proof = kernel.at.get(sig)
            if proof is not None:
                return proof
            trials = stack_trials(device, self.reference, sig) if self.reference is not None else "no reference"
            runs, why = (None, trials) if isinstance(trials, str) else plan_at(kernel, sig, device)
            if runs is not None:
                why = check_trials(kernel, trials, runs)
            proof = SignatureProof(kernel, why)
            if not why:
                proof.runs = runs
                proof.outputs = [(tuple(o.shape), o.dtype) for o in trials[0][1]]
                if device.type == "cuda":
                    from .launch_plan import make_plan

                    proof.plan, _ = make_plan(runs, random_inputs(sig, device))
            else:
                log.info("kernelsmith: kernel %s does not serve %s at %s: %s", kernel.record.sha256[:12],
                         self.name, [list(a[0]) for a in sig], why)
            if len(kernel.at) >= _MAX_ROUTES:
                kernel.at.clear()  # a server cycling through more lengths proves them again
            kernel.at[sig] = proof
            return proof

    def _bucket_race(self, kernel: PackKernel, sig: Signature, device: torch.device,
                     proof: SignatureProof) -> str:
        """"" where the kernel beats the stack's own path in ``sig``'s bucket (the power-of-two sizes of its free
        dims and its inputs' layouts; raced there once, and its problem's own bucket is the race it already won),
        else the reason counted."""
        g = self.guard
        if not g.race or self.own is None:
            return ""
        with kernel.lock:
            own_sig = spec_signature(kernel.problem.input_specs)
            if own_sig is not None:
                kernel.bucket_races.setdefault(free_bucket(self.free, own_sig), "")
            bucket = free_bucket(self.free, sig)
            if bucket not in kernel.bucket_races:
                kernel.bucket_races[bucket] = g.race_kernel(kernel, kernel.problem.key, device, self.own,
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
        # The hot path (see the module's docstring): in a decode step every served call pays it on the host, so it
        # reads each tensor attribute once, and an output of the form already checked goes straight back.
        if disabled():
            return self._miss(R_DISABLED)
        if not args:
            return self._miss(R_CALL)
        for a in args:
            if not isinstance(a, torch.Tensor):
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
            if racing():
                return None  # a stack's own path, timed in a race, came back through its layer: its own code runs
            self._settle(route)
        kernel = route.kernel
        if kernel is None:
            return self._miss(route.why)
        try:
            if grad:
                with torch.no_grad():
                    out = launch(route.plan, route.forward, args)
            else:
                out = launch(route.plan, route.forward, args)
        except Exception as e:  # noqa: BLE001 - never a broken model: the stack computes it instead
            self._broken(kernel, e)
            return self._miss(R_ERROR)
        if out is None:  # its plan declines this call (an input past its storage's start): the stack computes it
            return self._miss(R_DECLINED)
        if route.checked and type(out) is torch.Tensor:
            self._hit()
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not route.checked:
            if not self._outputs_fit(route, list(outs)):
                return self._miss(R_OUTPUT)
            route.checked = True
        self._hit()
        return outs[0] if len(outs) == 1 else tuple(outs)
