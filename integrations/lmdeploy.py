"""Serving kernels from a pack in LMDeploy's PyTorch engine.

LMDeploy's layers (``lmdeploy.pytorch.nn.RMSNorm``, ``SiluAndMul``) build their implementation once, in
``__init__``, through the device backend's ``build_op(spec)``: CUDA returns LMDeploy's Triton implementations,
MetaX MACA (and the other dlinfer devices) dlinfer's. LMDeploy has no plugin hook, so ``install()`` wraps
``build_op`` of the default, CUDA and dlinfer backends; it must run before the model is built (in each process
that builds one). Each implementation it returns serves our kernel for the signatures the pack verified and
calls LMDeploy's own implementation for everything else (``integrations.guard``).

Ops and the computation each is matched by (LMDeploy's own default implementation, in plain torch):

* ``rmsnorm``: ``RMSNorm`` called without a residual.
* ``add_rmsnorm``: ``RMSNorm`` called with one (the fused residual add): returns the norm and the new residual.
* ``silu_and_mul``: ``SiluAndMul`` on the concatenated ``[gate | up]`` activations.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from . import guard as G

log = logging.getLogger("kernelsmith.integrations")

STACK = "lmdeploy"
KNOWN_VERSIONS = ((0, 17), (0, 19))
OP_RMSNORM = "rmsnorm"
OP_ADD_RMSNORM = "add_rmsnorm"
OP_SILU_AND_MUL = "silu_and_mul"
# Backends whose own build_op returns the norm and activation implementations.
BACKENDS = (
    ("lmdeploy.pytorch.backends.default.op_backend", "DefaultOpsBackend"),
    ("lmdeploy.pytorch.backends.cuda.op_backend", "CudaOpsBackend"),
    ("lmdeploy.pytorch.backends.dlinfer.op_backend", "DlinferOpsBackend"),
)
_ORIGINAL = "_kernelsmith_build_op"
# RMSNorm implementations whose residual form returns new tensors (read in LMDeploy 0.18): the Triton one of the
# CUDA backend and the default one.
_OUT_OF_PLACE_NORMS = frozenset({"TritonRMSNormImpl", "DefaultRMSNormImpl"})


class State(G.StackState):
    """What ``install`` did: the guard, the backends wrapped, and why nothing was if so."""

    def __init__(self) -> None:
        super().__init__()
        self.wrapped: list[str] = []


_STATE = State()


def state() -> State:
    return _STATE


def stack_version() -> str | None:
    return G.installed_version("lmdeploy.version")


# ============================================================================================ ops


def _own_norm(impl: Any, residual: bool) -> Any:
    """The implementation build_op returned (LMDeploy's Triton one on CUDA) as the op's own path, for racing. Its
    residual form runs on copies where it may write into its inputs (a vendor's fused add)."""
    if not residual:
        def rms(x: Any, weight: Any) -> Any:
            return impl.forward(x, weight)

        return rms

    def add_rms(x: Any, weight: Any, residual: Any) -> Any:
        return impl.forward(x, weight, residual)

    return add_rms if type(impl).__name__ in _OUT_OF_PLACE_NORMS else G.OnCopies(add_rms, (0, 2))


def _wrap_rmsnorm(spec: Any, own: Any) -> Any:
    from lmdeploy.pytorch.backends.default.norm import DefaultRMSNormImpl
    from lmdeploy.pytorch.backends.norm import RMSNormImpl

    reference = DefaultRMSNormImpl(spec.hidden_size, spec.eps).forward
    group = ("lmdeploy.RMSNorm", float(spec.eps))
    plain = _STATE.served_op(OP_RMSNORM, group, reference, 2, _own_norm(own, residual=False))
    fused = _STATE.served_op(OP_ADD_RMSNORM, group, reference, 3, _own_norm(own, residual=True))
    if not plain and not fused:
        return own

    class ServedRMSNorm(RMSNormImpl):
        kernelsmith = True

        def forward(self, x: Any, weight: Any, residual: Any = None) -> Any:
            out = plain(x, weight) if residual is None else fused(x, weight, residual)
            return out if out is not None else own.forward(x, weight, residual)

    return ServedRMSNorm()


def _wrap_silu_and_mul(spec: Any, own: Any) -> Any:
    from lmdeploy.pytorch.backends.activation import SiluAndMulImpl
    from lmdeploy.pytorch.backends.default.activation import DefaultSiluAndMulImpl

    # Out of place whatever the spec asks: the reference must not write into the tensors it is traced on.
    reference = DefaultSiluAndMulImpl(False).forward
    # LMDeploy's in-place form writes its result into the input's gate half: raced on a copy.
    mine = G.OnCopies(own.forward, (0,)) if getattr(spec, "inplace", False) else own.forward
    served = _STATE.served_op(OP_SILU_AND_MUL, ("lmdeploy.SiluAndMul",), reference, 1, mine)
    if not served:
        return own

    class ServedSiluAndMul(SiluAndMulImpl):
        kernelsmith = True

        def forward(self, x: Any) -> Any:
            out = served(x)
            return out if out is not None else own.forward(x)

    return ServedSiluAndMul()


def _wrap(spec: Any, impl: Any) -> Any:
    if getattr(impl, "kernelsmith", False) or _STATE.guard is None:
        return impl  # a subclass's build_op already wrapped it through super()
    from lmdeploy.pytorch.backends.activation import SiluAndMulBuildSpec
    from lmdeploy.pytorch.backends.norm import RMSNormBuildSpec

    try:
        if isinstance(spec, RMSNormBuildSpec):
            return _wrap_rmsnorm(spec, impl)
        if isinstance(spec, SiluAndMulBuildSpec):
            return _wrap_silu_and_mul(spec, impl)
    except Exception as e:  # noqa: BLE001 - a wrapping problem leaves LMDeploy's implementation in place
        log.warning("kernelsmith: not serving %s: %s: %s", type(spec).__name__, type(e).__name__, e)
    return impl


# ============================================================================================ install


def _backend_classes() -> list[type]:
    out = []
    for mod_name, cls_name in BACKENDS:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except Exception as e:  # noqa: BLE001 - a backend whose vendor package is absent is not wrapped
            log.debug("kernelsmith: %s.%s not available: %s", mod_name, cls_name, e)
            continue
        if "build_op" in vars(cls):
            out.append(cls)
    return out


def install(pack: str | os.PathLike[str] | None = None, *, db: str | None = None,
            trust_keys: list[str] | None = None) -> State:
    """Serve ``pack`` (else ``KERNELSMITH_PACK``) in every LMDeploy layer built from now on in this process.

    Never raises for a pack, a kernel or a version problem: LMDeploy keeps its own implementations and
    ``state().refused`` says why. Installing again replaces an earlier install."""
    uninstall()
    st = _STATE
    guard, why = G.admit(STACK, stack_version(), KNOWN_VERSIONS, pack, db=db, trust_keys=trust_keys)
    if guard is None:
        st.refused = why
        return st
    st.guard = guard
    for cls in _backend_classes():
        original = vars(cls)["build_op"]

        def build_op(klass: type, spec: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            return _wrap(spec, _original.__func__(klass, spec, *args, **kwargs))

        setattr(cls, _ORIGINAL, original)
        cls.build_op = classmethod(build_op)
        st.wrapped.append(f"{cls.__module__}.{cls.__qualname__}")
    return st


def uninstall() -> None:
    """Give the backends their own ``build_op`` back (layers built meanwhile keep what they were given)."""
    for cls in _backend_classes_wrapped():
        cls.build_op = vars(cls)[_ORIGINAL]
        delattr(cls, _ORIGINAL)
    _STATE.__init__()


def _backend_classes_wrapped() -> list[type]:
    out = []
    for mod_name, cls_name in BACKENDS:
        mod = importlib.import_module(mod_name) if mod_name in _loaded_modules() else None
        cls = getattr(mod, cls_name, None) if mod is not None else None
        if cls is not None and _ORIGINAL in vars(cls):
            out.append(cls)
    return out


def _loaded_modules() -> set[str]:
    import sys

    return set(sys.modules)


# ============================================================================================ the pack it needs


def layer_problems(norms: list[tuple[tuple[int, ...], Any, float]] = (),
                   silu_and_mul: list[tuple[tuple[int, ...], Any]] = (),
                   residual_norms: list[tuple[tuple[int, ...], Any, float]] = ()) -> list[Any]:
    """The problems LMDeploy's layers compute: an RMSNorm per (input shape, dtype, eps), without and with the fused
    residual, and a SiluAndMul per (input shape, dtype). LMDeploy's engine packs a batch's tokens into one
    sequence, so shapes are ``(1, tokens, hidden)`` and ``(1, tokens, 2 * intermediate)`` for each token count a
    deployment runs."""
    import torch
    from lmdeploy.pytorch.backends.default.activation import DefaultSiluAndMulImpl
    from lmdeploy.pytorch.backends.default.norm import DefaultRMSNormImpl

    from .ops import Binding, layer_problem

    def meta(*shape: int, dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device="meta")

    out = []
    for residual, specs in ((False, norms), (True, residual_norms)):
        for shape, dtype, eps in specs:
            ref = DefaultRMSNormImpl(shape[-1], eps).forward
            args = [meta(*shape, dtype=dtype), meta(shape[-1], dtype=dtype)]
            if residual:
                args.append(meta(*shape, dtype=dtype))
            op = OP_ADD_RMSNORM if residual else OP_RMSNORM
            out.append(layer_problem(Binding(op, ref, ()), args, name=op))
    for shape, dtype in silu_and_mul:
        ref = DefaultSiluAndMulImpl(False).forward
        out.append(layer_problem(Binding(OP_SILU_AND_MUL, ref, ()), [meta(*shape, dtype=dtype)],
                                 name=OP_SILU_AND_MUL))
    return out


# ============================================================================================ the search's peer

# The eps values an RMSNorm problem is tried at to find which one it computes (LMDeploy's and common models').
_EPS_TRIED = (1e-6, 1e-5, 1e-8)


def _own_backend(device_type: str) -> Any:
    """LMDeploy's op backend for a device type (CUDA's, else its default one), with its own ``build_op`` even where
    ``install`` wrapped it."""
    mod_name, cls_name = BACKENDS[1] if device_type == "cuda" else BACKENDS[0]
    cls = getattr(importlib.import_module(mod_name), cls_name)
    build = vars(cls).get(_ORIGINAL) or vars(cls)["build_op"]
    return lambda spec: build.__func__(cls, spec)


def _close(got: Any, want: Any) -> float:
    """The largest difference between two outputs (tuples elementwise), inf where their shapes differ."""
    import torch

    from .checks import _as_list

    got, want = _as_list(got), _as_list(want)
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            return float("inf")
        worst = max(worst, float((g.float() - w.float()).abs().max()) if g.numel() else 0.0)
    return worst


def own_kernel(model: Any, inputs: list[Any]) -> Any:
    """LMDeploy's own implementation of what ``model`` computes on ``inputs``, as a callable of those inputs: the
    judge's factory for timing LMDeploy's kernels as a search's baseline (``JudgeConfig.peers``). It is what
    LMDeploy's backend for the inputs' device builds (its Triton kernels on CUDA, its default torch code elsewhere),
    for an RMSNorm (inputs: x, weight), an RMSNorm with the fused residual add (x, weight, residual) or SiLU·mul
    (the concatenated gate and up). Found by computing, as ``ops`` matches layers: each op that takes such inputs
    runs on them, and the one whose outputs come closest to the model's is it (an RMSNorm's eps is found the same
    way, among ``_EPS_TRIED``). None where no op takes such inputs."""
    import torch
    from lmdeploy.pytorch.backends.activation import SiluAndMulBuildSpec
    from lmdeploy.pytorch.backends.norm import RMSNormBuildSpec

    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors or len(tensors) != len(inputs):
        return None
    build = _own_backend(tensors[0].device.type)
    options: list[Any] = []
    if len(inputs) == 1 and inputs[0].shape[-1] % 2 == 0:
        impl = build(SiluAndMulBuildSpec(inplace=False))
        options.append(lambda x, impl=impl: impl.forward(x))
    elif len(inputs) in (2, 3) and inputs[1].dim() == 1 and inputs[1].shape[0] == inputs[0].shape[-1]:
        for eps in _EPS_TRIED:
            impl = build(RMSNormBuildSpec(hidden_size=int(inputs[0].shape[-1]), eps=eps))
            options.append(_own_norm(impl, residual=len(inputs) == 3))
    if not options:
        return None
    with torch.no_grad():
        want = model(*[x.clone() for x in inputs])
        best = min(options, key=lambda fn: _close(fn(*[x.clone() for x in inputs]), want))
    return best
