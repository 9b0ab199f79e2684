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


def _served(op: str, group: tuple, reference: Any, arity: int) -> G.ServedOp:
    from .ops import Binding, key_function

    st = _STATE
    with st.lock:
        served = st.served.get((op, group))
        if served is None:
            assert st.guard is not None
            served = st.guard.bind(op, key_function(Binding(op, reference, group)), reference, arity)
            st.served[(op, group)] = served
            if served:
                log.info("kernelsmith: lmdeploy %s %s serves pack kernels for %d signatures", op, group[1:],
                         len(served.table))
        return served


def _wrap_rmsnorm(spec: Any, own: Any) -> Any:
    from lmdeploy.pytorch.backends.default.norm import DefaultRMSNormImpl
    from lmdeploy.pytorch.backends.norm import RMSNormImpl

    reference = DefaultRMSNormImpl(spec.hidden_size, spec.eps).forward
    group = ("lmdeploy.RMSNorm", float(spec.eps))
    plain = _served(OP_RMSNORM, group, reference, 2)
    fused = _served(OP_ADD_RMSNORM, group, reference, 3)
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
    served = _served(OP_SILU_AND_MUL, ("lmdeploy.SiluAndMul",), reference, 1)
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
