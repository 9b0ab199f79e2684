"""Serving kernels from a pack in vLLM.

``register()`` is a ``vllm.general_plugins`` entry point (vLLM calls it in every process, filtered by
``VLLM_PLUGINS``), enabled by ``KERNELSMITH_PACK``. It registers out-of-tree subclasses of vLLM's ``RMSNorm`` and
``SiluAndMul`` with ``CustomOp.register_oot``, which ``CustomOp.__new__`` instantiates in their place. Both
``forward_native`` (what runs with custom ops off, the default under vLLM's compilation) and ``forward_cuda`` try
our kernel first and call vLLM's own method for anything the pack did not verify (``integrations.guard``).

Ops and the computation each is matched by (vLLM's own native implementations):

* ``rmsnorm``: ``RMSNorm(x)`` with a weight and no variance-size override: ``ir.ops.rms_norm``'s native impl.
* ``add_rmsnorm``: ``RMSNorm(x, residual)``: ``ir.ops.fused_add_rms_norm``'s native impl (inputs x, residual,
  weight; outputs the norm and the new residual).
* ``silu_and_mul``: ``SiluAndMul.forward_native``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from . import guard as G

log = logging.getLogger("kernelsmith.integrations")

STACK = "vllm"
KNOWN_VERSIONS = ((0, 30), (0, 34))
OP_RMSNORM = "rmsnorm"
OP_ADD_RMSNORM = "add_rmsnorm"
OP_SILU_AND_MUL = "silu_and_mul"
_NAMES = ("RMSNorm", "SiluAndMul")


class State(G.StackState):
    """What ``register`` did: the guard, the layer classes registered, and why nothing was if so."""

    def __init__(self) -> None:
        super().__init__()
        self.registered: list[str] = []


_STATE = State()


def state() -> State:
    return _STATE


def stack_version() -> str | None:
    return G.installed_version("vllm")


def _native(name: str) -> Any:
    from vllm import ir

    return getattr(ir.ops, name).impls["native"].impl_fn


def references(eps: float) -> dict[str, Any]:
    """vLLM's own computation of each op, as functions of the op's tensor inputs."""
    from vllm.model_executor.layers.activation import SiluAndMul

    rms, fused = _native("rms_norm"), _native("fused_add_rms_norm")
    return {OP_RMSNORM: lambda x, w: rms(x, w, eps, None),
            OP_ADD_RMSNORM: lambda x, r, w: fused(x, r, w, eps, None),
            OP_SILU_AND_MUL: SiluAndMul.forward_native}


# Set while vLLM's own RMSNorm.forward_cuda runs: it calls self.forward_native, which here is ours, and that call is
# vLLM's own path, not another call to serve (nor to count).
_IN_OWN_CUDA = threading.local()


def own_forward_cuda(layer: Any, x: Any, residual: Any = None) -> Any:
    """vLLM's ``RMSNorm.forward_cuda`` as it runs without us."""
    from vllm.model_executor.layers.layernorm import RMSNorm

    _IN_OWN_CUDA.on = True
    try:
        return RMSNorm.forward_cuda(layer, x, residual)
    finally:
        _IN_OWN_CUDA.on = False


def norm_own_paths(layer: Any, method: Any) -> dict[str, Any]:
    """vLLM's own ``method`` (``RMSNorm.forward_native`` or ``own_forward_cuda``, the one its dispatcher chose) for the
    two norm ops, as functions of their tensor inputs, for racing a kernel: with the layer's own weight (the race
    only times it), the residual form on copies of x and the residual, which vLLM's fused op may write in place."""

    def rms(x: Any, w: Any) -> Any:
        return method(layer, x)

    def add_rms(x: Any, r: Any, w: Any) -> Any:
        return method(layer, x, r)

    return {OP_RMSNORM: rms, OP_ADD_RMSNORM: G.OnCopies(add_rms, (0, 1))}


def _serve(op: G.ServedOp, *args: Any) -> Any:
    return op(*args)


def _opaque() -> Any:
    """``_serve`` opaque to Dynamo: vLLM compiles its layers' native forwards, and the guard's bookkeeping and the
    kernel's launch must not be traced into that graph (a graph break there instead)."""
    global _SERVE_OPAQUE
    if _SERVE_OPAQUE is None:
        import torch

        _SERVE_OPAQUE = torch.compiler.disable(_serve)
    return _SERVE_OPAQUE


_SERVE_OPAQUE: Any = None


def _classes() -> tuple[type, type]:
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    class KernelsmithRMSNorm(RMSNorm):
        def _kernelsmith(self, x: Any, residual: Any, method: Any) -> Any:
            ops = self.__dict__.get("_kernelsmith_ops")
            if ops is None:
                ops = (None, None)
                if self.has_weight and self.variance_size_override is None:
                    eps = float(self.variance_epsilon)
                    refs, owns = references(eps), norm_own_paths(self, method)
                    group = ("vllm.RMSNorm", eps)
                    ops = (_STATE.served_op(OP_RMSNORM, group, refs[OP_RMSNORM], 2, owns[OP_RMSNORM]),
                           _STATE.served_op(OP_ADD_RMSNORM, group, refs[OP_ADD_RMSNORM], 3, owns[OP_ADD_RMSNORM]))
                self.__dict__["_kernelsmith_ops"] = ops
            plain, fused = ops
            if residual is None:
                return _opaque()(plain, x, self.weight.data) if plain else None
            return _opaque()(fused, x, residual, self.weight.data) if fused else None

        def forward_native(self, x: Any, residual: Any = None) -> Any:
            inside = getattr(_IN_OWN_CUDA, "on", False)  # reached from vLLM's own forward_cuda
            out = None if inside else self._kernelsmith(x, residual, RMSNorm.forward_native)
            return out if out is not None else super().forward_native(x, residual)

        def forward_cuda(self, x: Any, residual: Any = None) -> Any:
            out = self._kernelsmith(x, residual, own_forward_cuda)
            return out if out is not None else own_forward_cuda(self, x, residual)

    class KernelsmithSiluAndMul(SiluAndMul):
        def _kernelsmith(self, x: Any, cuda: bool) -> Any:
            op = self.__dict__.get("_kernelsmith_op")
            if op is None:
                own = self._own_cuda if cuda else SiluAndMul.forward_native  # what the dispatcher chose
                op = _STATE.served_op(OP_SILU_AND_MUL, ("vllm.SiluAndMul",), SiluAndMul.forward_native, 1, own)
                self.__dict__["_kernelsmith_op"] = op
            return _opaque()(op, x) if op else None

        # forward_native is a staticmethod on vLLM's class; here it is an instance method, which is what the
        # dispatcher binds either way.
        def forward_native(self, x: Any) -> Any:  # type: ignore[override]
            out = self._kernelsmith(x, False)
            return out if out is not None else SiluAndMul.forward_native(x)

        def forward_cuda(self, x: Any) -> Any:
            out = self._kernelsmith(x, True)
            return out if out is not None else super().forward_cuda(x)

        def _own_cuda(self, x: Any) -> Any:
            return SiluAndMul.forward_cuda(self, x)

    return KernelsmithRMSNorm, KernelsmithSiluAndMul


def register(pack: str | os.PathLike[str] | None = None, *, trust_keys: list[str] | None = None) -> State:
    """The ``vllm.general_plugins`` entry point. Serves ``pack`` (else ``KERNELSMITH_PACK``; nothing when neither
    is set) in every vLLM ``RMSNorm`` and ``SiluAndMul`` built from now on in this process. Never raises."""
    st = _STATE
    if st.registered:
        return st
    guard, why = G.admit(STACK, stack_version(), KNOWN_VERSIONS, pack, trust_keys=trust_keys, need_pack=True)
    if guard is None:
        st.refused = why
        return st
    try:
        from vllm.model_executor.custom_op import CustomOp, op_registry_oot

        taken = [n for n in _NAMES if n in op_registry_oot]
        if taken:
            st.refused = f"another plugin already replaces {', '.join(taken)}"
            log.warning("kernelsmith: %s; vllm keeps it", st.refused)
            return st
        for name, cls in zip(_NAMES, _classes()):
            CustomOp.register_oot(cls, name=name)
            st.registered.append(name)
    except Exception as e:  # noqa: BLE001 - an API that moved leaves vLLM's layers in place
        st.refused = f"registering the layers failed: {type(e).__name__}: {e}"
        log.warning("kernelsmith: %s; vllm keeps its own kernels", st.refused)
        unregister()
        st.refused = f"registering the layers failed: {type(e).__name__}: {e}"
        return st
    st.guard = guard
    return st


def unregister() -> None:
    """Drop our classes from vLLM's registry (layers built meanwhile keep theirs)."""
    try:
        from vllm.model_executor.custom_op import op_registry_oot
    except ImportError:
        op_registry_oot = {}
    for name in _STATE.registered:
        op_registry_oot.pop(name, None)
    _STATE.__init__()


def layer_problems(norms: list[tuple[tuple[int, ...], Any, float]] = (),
                   silu_and_mul: list[tuple[tuple[int, ...], Any]] = (),
                   residual_norms: list[tuple[tuple[int, ...], Any, float]] = ()) -> list[Any]:
    """The problems vLLM's layers compute: an RMSNorm per (input shape, dtype, eps), without and with the fused
    residual, and a SiluAndMul per (input shape, dtype); vLLM runs ``(tokens, hidden)`` activations."""
    import torch

    from .ops import Binding, layer_problem

    def meta(*shape: int, dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device="meta")

    out = []
    for shape, dtype, eps in norms:
        args = [meta(*shape, dtype=dtype), meta(shape[-1], dtype=dtype)]
        out.append(layer_problem(Binding(OP_RMSNORM, references(eps)[OP_RMSNORM], ()), args, name=OP_RMSNORM))
    for shape, dtype, eps in residual_norms:
        args = [meta(*shape, dtype=dtype), meta(*shape, dtype=dtype), meta(shape[-1], dtype=dtype)]
        out.append(layer_problem(Binding(OP_ADD_RMSNORM, references(eps)[OP_ADD_RMSNORM], ()), args,
                                 name=OP_ADD_RMSNORM))
    for shape, dtype in silu_and_mul:
        out.append(layer_problem(Binding(OP_SILU_AND_MUL, references(1e-6)[OP_SILU_AND_MUL], ()),
                                 [meta(*shape, dtype=dtype)], name=OP_SILU_AND_MUL))
    return out
