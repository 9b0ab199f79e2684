"""Serving kernels from a pack in SGLang.

``register()`` is a ``sglang.srt.plugins`` entry point: SGLang's ``load_plugins()`` calls it in every process
(engine, scheduler, workers; ``SGLANG_PLUGINS`` filters by name), then applies the hooks it registered with
``HookRegistry.apply_hooks()``. It does nothing unless ``KERNELSMITH_PACK`` names a pack. It registers
``HookType.REPLACE`` hooks on the forwards of SGLang's layer classes:

* ``sglang.srt.layers.layernorm.RMSNorm.forward_native`` and ``.forward_cuda``: ``rmsnorm`` (inputs x, weight)
  for ``layer(x)``, and ``add_rmsnorm`` (inputs x, residual, weight; outputs the norm and the new residual) for
  ``layer(x, residual)``.
* ``sglang.srt.layers.activation.SiluAndMul.forward_native`` and ``.forward_cuda``: ``silu_and_mul`` (input x).

SGLang's layers resolve their forward once, on first call (``BaseFusedOp._resolve_forward_method``): on a GPU
``forward_cuda``, on a CPU without AMX and under ``torch.compile`` ``forward_native``; the class attributes are
replaced before any model is built, so every instance dispatches to the replacement. Each replacement tries the
pack's kernel (``integrations.guard``: verified pack, golden vectors on the device, per-call shape, dtype,
stride and device check) and otherwise calls SGLang's own method, captured when the hook was registered. A layer
is matched to a pack problem by tracing SGLang's own ``forward_native`` at the problem's signature
(``integrations.ops``), so a layer with other settings (``cast_x_before_out_mul``, ``fp32_residual``, a variance
size override, ...) matches only a problem computing exactly that.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from . import guard as G

log = logging.getLogger("kernelsmith.integrations")

STACK = "sglang"
# Releases whose plugin framework (HookRegistry) and RMSNorm / SiluAndMul forwards were read and tested.
KNOWN_VERSIONS = ((0, 5, 23), (0, 6))
OP_RMSNORM = "rmsnorm"
OP_ADD_RMSNORM = "add_rmsnorm"
OP_SILU_AND_MUL = "silu_and_mul"
NORM = "sglang.srt.layers.layernorm.RMSNorm"
ACT = "sglang.srt.layers.activation.SiluAndMul"
METHODS = ("forward_native", "forward_cuda")


class State(G.StackState):
    """What ``register`` did: the guard, the targets hooked (with SGLang's own functions), why nothing was."""

    def __init__(self) -> None:
        super().__init__()
        self.hooked: dict[str, Any] = {}  # target -> SGLang's own function
        self.hooks: dict[str, Any] = {}  # target -> our replacement


_STATE = State()


def state() -> State:
    return _STATE


def stack_version() -> str | None:
    return G.installed_version("sglang")


# ============================================================================================ what SGLang computes


def _norm_settings(layer: Any) -> tuple:
    """Everything besides the tensors that SGLang's ``RMSNorm.forward_native`` reads."""
    return (float(layer.variance_epsilon), int(layer.hidden_size), layer.variance_size_override,
            bool(layer.cast_x_before_out_mul), bool(layer.fp32_residual), layer.override_orig_dtype,
            bool(layer.has_weight))


def norm_references(layer: Any, native: Any = None) -> dict[str, Any]:
    """SGLang's own computation of a layer's two norm ops, as functions of their tensor inputs: its
    ``forward_native`` (``native``, else the class's current one) with the weight as an input."""
    from torch.nn.utils.stateless import _reparametrize_module

    if native is None:
        from sglang.srt.layers.layernorm import RMSNorm

        native = _STATE.hooked.get(f"{NORM}.forward_native", RMSNorm.forward_native)

    def rms(x: torch.Tensor, w: torch.Tensor) -> Any:
        with _reparametrize_module(layer, {"weight": w}):
            return native(layer, x)

    def add_rms(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> Any:
        with _reparametrize_module(layer, {"weight": w}):
            return native(layer, x, r)

    return {OP_RMSNORM: rms, OP_ADD_RMSNORM: add_rms}


def silu_and_mul_reference() -> Any:
    """SGLang's own ``SiluAndMul.forward_native`` as a function of its input."""
    from sglang.srt.layers.activation import SiluAndMul

    native = _STATE.hooked.get(f"{ACT}.forward_native", SiluAndMul.forward_native)
    layer = SiluAndMul()

    def silu_and_mul(x: torch.Tensor) -> Any:
        return native(layer, x)

    return silu_and_mul


# ============================================================================================ the replacements


def _call(op: G.ServedOp, *args: Any) -> Any:
    return op(*args)


_CALL_OPAQUE: Any = None


def _opaque() -> Any:
    """``_call`` opaque to Dynamo: SGLang's ``--enable-torch-compile`` compiles the layers' native forwards, and
    the guard's bookkeeping and the kernel's launch must not be traced into that graph (a graph break there)."""
    global _CALL_OPAQUE
    if _CALL_OPAQUE is None:
        _CALL_OPAQUE = torch.compiler.disable(_call)
    return _CALL_OPAQUE


def norm_own_paths(layer: Any, method: Any) -> dict[str, Any]:
    """SGLang's own ``method`` (the ``forward_native`` or ``forward_cuda`` it dispatched the layer to) for the two
    norm ops, as functions of their tensor inputs, for racing a kernel: with the layer's own weight (the race only
    times it), the residual form on copies of x and the residual, which SGLang's fused CUDA kernel writes in place."""

    def rms(x: torch.Tensor, w: torch.Tensor) -> Any:
        return method(layer, x)

    def add_rms(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> Any:
        return method(layer, x, r)

    return {OP_RMSNORM: rms, OP_ADD_RMSNORM: G.OnCopies(add_rms, (0, 1))}


def _norm_ops(layer: Any, method: Any) -> tuple[G.ServedOp | None, G.ServedOp | None]:
    ops = layer.__dict__.get("_kernelsmith_ops")
    if ops is None:
        ops = (None, None)
        if layer.has_weight and isinstance(layer.weight, torch.nn.Parameter):
            group = ("sglang.RMSNorm", _norm_settings(layer), tuple(layer.weight.shape), layer.weight.dtype)
            refs, owns = norm_references(layer), norm_own_paths(layer, method)
            ops = (_STATE.served_op(OP_RMSNORM, group, refs[OP_RMSNORM], 2, owns[OP_RMSNORM]),
                   _STATE.served_op(OP_ADD_RMSNORM, group, refs[OP_ADD_RMSNORM], 3, owns[OP_ADD_RMSNORM]))
        layer.__dict__["_kernelsmith_ops"] = ops
    return ops


def _serve_norm(layer: Any, x: Any, residual: Any, extra: tuple, kwargs: dict, method: Any) -> Any:
    """The pack's result for ``layer(x[, residual])``, or None where SGLang must compute it (with ``method``)."""
    if extra or any(v is not None for v in kwargs.values()):
        return None  # post_residual_addition, a fused quantizing linear: SGLang's own path
    plain, fused = _norm_ops(layer, method)
    if residual is None:
        return _opaque()(plain, x, layer.weight.data) if plain else None
    return _opaque()(fused, x, residual, layer.weight.data) if fused else None


def _norm_hook(original: Any) -> Any:
    def forward(self: Any, x: Any, residual: Any = None, *extra: Any, **kwargs: Any) -> Any:
        out = _serve_norm(self, x, residual, extra, kwargs, original)
        return out if out is not None else original(self, x, residual, *extra, **kwargs)

    forward.__name__ = forward.__qualname__ = getattr(original, "__name__", "forward")
    return forward


def _act_op(layer: Any, method: Any) -> G.ServedOp | None:
    op = layer.__dict__.get("_kernelsmith_op", False)
    if op is False:
        def own(x: torch.Tensor) -> Any:  # SGLang's own method the layer dispatched to, for racing
            return method(layer, x)

        op = _STATE.served_op(OP_SILU_AND_MUL, ("sglang.SiluAndMul",), silu_and_mul_reference(), 1, own)
        layer.__dict__["_kernelsmith_op"] = op
    return op


def _act_hook(original: Any) -> Any:
    def forward(self: Any, x: Any, *extra: Any, **kwargs: Any) -> Any:
        op = None if extra or kwargs else _act_op(self, original)
        out = _opaque()(op, x) if op else None
        return out if out is not None else original(self, x, *extra, **kwargs)

    forward.__name__ = forward.__qualname__ = getattr(original, "__name__", "forward")
    return forward


# ============================================================================================ the entry point


def register(pack: str | os.PathLike[str] | None = None, *, trust_keys: list[str] | None = None) -> State:
    """The ``sglang.srt.plugins`` entry point. Serves ``pack`` (else ``KERNELSMITH_PACK``; nothing when neither is
    set) in SGLang's ``RMSNorm`` and ``SiluAndMul``: registers REPLACE hooks, which ``load_plugins()`` applies
    right after (call ``apply()`` when registering outside it). Never raises."""
    st = _STATE
    if st.hooked:
        return st
    guard, why = G.admit(STACK, stack_version(), KNOWN_VERSIONS, pack, trust_keys=trust_keys, need_pack=True)
    if guard is None:
        st.refused = why
        return st
    try:
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.layers.layernorm import RMSNorm
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for cls, target, make in ((RMSNorm, NORM, _norm_hook), (SiluAndMul, ACT, _act_hook)):
            for name in METHODS:
                original = cls.__dict__[name]
                if isinstance(original, staticmethod):
                    raise TypeError(f"{target}.{name} is a staticmethod")
                hook = make(original)
                HookRegistry.register(f"{target}.{name}", hook, HookType.REPLACE)
                st.hooked[f"{target}.{name}"], st.hooks[f"{target}.{name}"] = original, hook
    except Exception as e:  # noqa: BLE001 - an API that moved leaves SGLang's layers as they are
        st.refused = f"registering the hooks failed: {type(e).__name__}: {e}"
        log.warning("kernelsmith: %s; sglang keeps its own kernels", st.refused)
        unregister()
        st.refused = f"registering the hooks failed: {type(e).__name__}: {e}"
        return st
    st.guard = guard
    log.info("kernelsmith: sglang serves pack %s in %s", guard.path, ", ".join(st.hooked))
    return st


def apply() -> None:
    """Apply the registered hooks now (what ``load_plugins()`` does after calling the plugins)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()


def unregister() -> None:
    """Take our hooks out of SGLang's registry and give the classes their own forwards back (instances that
    already resolved their forward keep the one they cached)."""
    import importlib

    try:
        from sglang.srt.plugins.hook_registry import HookRegistry
    except ImportError:
        HookRegistry = None  # noqa: N806
    for target, original in _STATE.hooked.items():
        if HookRegistry is not None:
            kept = [h for h in HookRegistry._hooks.get(target, []) if h[1] is not _STATE.hooks.get(target)]
            HookRegistry._hooks.pop(target, None)
            if kept:
                HookRegistry._hooks[target] = kept
            HookRegistry._patched.discard(target)
        owner, name = target.rsplit(".", 1)
        module, cls_name = owner.rsplit(".", 1)
        try:
            setattr(getattr(importlib.import_module(module), cls_name), name, original)
        except (ImportError, AttributeError):
            continue
    _STATE.__init__()


# ============================================================================================ the pack a model needs


def layer_problems(norms: list[tuple[tuple[int, ...], Any, float]] = (),
                   silu_and_mul: list[tuple[tuple[int, ...], Any]] = (),
                   residual_norms: list[tuple[tuple[int, ...], Any, float]] = ()) -> list[Any]:
    """The problems SGLang's layers compute: an ``RMSNorm(hidden, eps)`` per (input shape, dtype, eps), without
    and with the residual, and a ``SiluAndMul`` per (input shape, dtype). SGLang runs ``(tokens, hidden)``
    activations; the weight has the activations' dtype (as in a model loaded in that dtype)."""
    from sglang.srt.layers.layernorm import RMSNorm

    from .ops import Binding, layer_problem

    def meta(*shape: int, dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device="meta")

    out = []
    for op, specs in ((OP_RMSNORM, norms), (OP_ADD_RMSNORM, residual_norms)):
        for shape, dtype, eps in specs:
            ref = norm_references(RMSNorm(shape[-1], eps))[op]
            acts = [meta(*shape, dtype=dtype)] * (2 if op == OP_ADD_RMSNORM else 1)  # x (and the residual)
            out.append(layer_problem(Binding(op, ref, ()), [*acts, meta(shape[-1], dtype=dtype)], name=op))
    for shape, dtype in silu_and_mul:
        out.append(layer_problem(Binding(OP_SILU_AND_MUL, silu_and_mul_reference(), ()),
                                 [meta(*shape, dtype=dtype)], name=OP_SILU_AND_MUL))
    return out
