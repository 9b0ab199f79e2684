"""Operations the canonical aten form keeps whole.

``F.scaled_dot_product_attention`` is CompositeImplicitAutograd: traced to aten it becomes whatever backend
torch picks for the tracing device (cuDNN, flash or memory-efficient attention on a GPU, a math decomposition of
bmm and softmax on a CPU). A key built from that would differ between the machine that warms a cache and the
one that serves it, and a template would have to recognise every backend's spelling. So key tracing
(:func:`ks_inductor.problem_tracing.trace_aten`) routes the call to ``kernelsmith::sdpa``, an opaque op whose
implementation is the same torch call: the problem's reference, and Inductor's baseline, still run torch's own
attention, while the graph names what is computed rather than how.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SDPA_TARGET = "kernelsmith.sdpa.default"
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


@torch.library.custom_op("kernelsmith::sdpa", mutates_args=())
def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
         dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return out.contiguous()  # a custom op may not return a view of its inputs; fused backends return views


@sdpa.register_fake
def _sdpa_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
               dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


class _CanonicalFunctions(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            vals = dict(zip(_SDPA_PARAMS, _SDPA_DEFAULTS))
            vals.update(zip(_SDPA_PARAMS, args))
            vals.update(kwargs)
            scale = vals["scale"]
            return torch.ops.kernelsmith.sdpa(
                vals["query"], vals["key"], vals["value"], vals["attn_mask"], float(vals["dropout_p"]),
                bool(vals["is_causal"]), None if scale is None else float(scale), bool(vals["enable_gqa"]))
        return func(*args, **kwargs)


@contextlib.contextmanager
def canonical_functions() -> Iterator[None]:
    """Route the torch functions above to their whole-op form while tracing a key."""
    with _CanonicalFunctions():
        yield
