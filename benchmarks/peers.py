"""The tools a user would pick instead of kernelsmith, each as a zero-argument callable over fixed inputs.

A builder takes the problem's reference ``Model`` (on the device, with its weights) and the list of input tensors
that the timing loop refreshes in place before each call, and returns ``fn`` such that ``fn()`` computes the
problem's outputs. A builder raises :class:`PeerUnavailable` when the tool is not installed or has no such op;
that is reported, never papered over.

Inductor max-autotune runs as ``mode="max-autotune-no-cudagraphs"``: the protocol times single calls with an L2
flush between them, which CUDA-graph replay of a static-address graph does not fit, so no tool gets CUDA graphs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

EAGER = "eager"
INDUCTOR = "inductor"
INDUCTOR_MAX = "inductor-max-autotune"
LIGER = "liger"
F_RMS_NORM = "F.rms_norm"

GENERIC_PEERS = (EAGER, INDUCTOR, INDUCTOR_MAX)

NOTES = {
    INDUCTOR: 'torch.compile(model), mode "default"',
    INDUCTOR_MAX: 'torch.compile(model, mode="max-autotune-no-cudagraphs")',
    F_RMS_NORM: "torch.nn.functional.rms_norm (fused ATen kernel)",
}

Builder = Callable[[Any, list[Any]], Callable[[], Any]]


class PeerUnavailable(Exception):
    """The tool cannot run this workload here; the message says why (not installed, no such op)."""


def _eager(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    return lambda: model(*inputs)


def _compiled(mode: str | None) -> Builder:
    def build(model: Any, inputs: list[Any]) -> Callable[[], Any]:
        import torch

        compiled = torch.compile(model, mode=mode)
        return lambda: compiled(*inputs)

    return build


def _liger_attr(module: str, name: str) -> Any:
    try:
        mod = importlib.import_module(f"liger_kernel.ops.{module}")
    except ImportError as e:
        raise PeerUnavailable(f"liger-kernel is not installed or lacks ops.{module} ({e}); "
                              "pip install liger-kernel") from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise PeerUnavailable(f"this liger-kernel has no liger_kernel.ops.{module}.{name}")
    return fn


def _liger_rmsnorm(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    f = _liger_attr("rms_norm", "LigerRMSNormFunction")
    x, = inputs
    # casting_mode "llama" (its default) is the reference's numerics: normalize in fp32, cast, then scale.
    return lambda: f.apply(x, model.weight, model.eps)


def _liger_layernorm(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    f = _liger_attr("layer_norm", "LigerLayerNormFunction")
    x, = inputs
    return lambda: f.apply(x, model.weight, model.bias, model.eps)


def _liger_softmax(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    f = _liger_attr("softmax", "LigerSoftmaxFunction")
    if getattr(model, "dim", -1) not in (-1, inputs[0].dim() - 1):
        raise PeerUnavailable("Liger's softmax only normalizes over the last dimension")
    x, = inputs
    return lambda: f.apply(x)


def _liger_silu_mul(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    f = _liger_attr("swiglu", "LigerSiLUMulFunction")
    gate, up = inputs
    return lambda: f.apply(gate, up)


def _liger_rope(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    # Liger's rope works in place on the (batch, tokens, heads, dim) storage of a projection's output; on these
    # contiguous (batch, heads, tokens, dim) inputs it first copies to that layout (no copy when tokens == 1),
    # and that copy is part of its time. In-place updates are harmless here: inputs are refreshed before each call.
    f = _liger_attr("rope", "LigerRopeFunction")
    q, k, cos, sin = inputs
    return lambda: f.apply(q, k, cos, sin)


def _liger_cross_entropy(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    f = _liger_attr("cross_entropy", "LigerCrossEntropyFunction")
    logits, target = inputs
    if logits.requires_grad:
        raise PeerUnavailable("forward-only comparison needs logits without requires_grad")

    # forward(_input, target, weight, ignore_index=-100, ..., reduction="mean") returns (loss, z_loss, ...);
    # weight has no default, so pass None explicitly (the anchors run failed for want of it).
    def fn() -> Any:
        return f.apply(logits, target, None)[0]

    return fn


def _f_rms_norm(model: Any, inputs: list[Any]) -> Callable[[], Any]:
    import torch.nn.functional as F

    if not hasattr(F, "rms_norm"):
        raise PeerUnavailable("this torch has no torch.nn.functional.rms_norm (added in 2.4)")
    x, = inputs
    shape = (x.shape[-1],)
    return lambda: F.rms_norm(x, shape, model.weight, model.eps)


# Op-specific peers, by workload op.
OP_PEERS: dict[str, dict[str, Builder]] = {
    "rmsnorm": {F_RMS_NORM: _f_rms_norm, LIGER: _liger_rmsnorm},
    "layernorm": {LIGER: _liger_layernorm},
    "softmax": {LIGER: _liger_softmax},
    "silu_mul": {LIGER: _liger_silu_mul},
    "rope": {LIGER: _liger_rope},
    "cross_entropy": {LIGER: _liger_cross_entropy},
    "gemm_gelu": {},
}


def generic_builders() -> dict[str, Builder]:
    return {EAGER: _eager, INDUCTOR: _compiled(None), INDUCTOR_MAX: _compiled("max-autotune-no-cudagraphs")}


def peers_for(op: str | None, wanted: list[str] | None = None) -> dict[str, Builder]:
    """Builders for a workload's peers in a fixed order: eager, Inductor, Inductor max-autotune, then the op's
    own peers (Liger, F.rms_norm). ``wanted`` filters by name; eager is always kept, it is the baseline."""
    builders = generic_builders()
    builders.update(OP_PEERS.get(op or "", {}))
    if wanted:
        unknown = [w for w in wanted if w not in all_peer_names()]
        if unknown:
            raise ValueError(f"unknown peer {', '.join(unknown)}; choose from {', '.join(all_peer_names())}")
        builders = {k: v for k, v in builders.items() if k in wanted or k == EAGER}
    return builders


def all_peer_names() -> list[str]:
    names = list(GENERIC_PEERS)
    for d in OP_PEERS.values():
        names += [n for n in d if n not in names]
    return names
