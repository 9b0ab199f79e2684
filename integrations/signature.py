"""Input signatures in serving: what a guard matches calls by, tensors made at one (a layer's own computation is
traced and a kernel proven there), and the signatures a kernel may be proven at besides its problem's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The signature itself is defined in ks_inductor, where a kernel's judged plan is checked against it.
from ks_inductor.signature import Signature, call_signature, dtype_named, spec_signature

__all__ = ["Signature", "call_signature", "dtype_named", "spec_signature"]


def meta_inputs(sig: Signature) -> list[torch.Tensor]:
    """Tensors of a signature with no memory behind them, for tracing a reference at that signature."""
    return [torch.empty_strided(shape, stride, dtype=dt, device="meta") for shape, dt, stride in sig]


def random_inputs(sig: Signature, device: torch.device, gen: torch.Generator | None = None) -> list[torch.Tensor]:
    """Seeded inputs at a signature on ``device``: normal floats, small non-negative integers."""
    gen = gen if gen is not None else torch.Generator(device=device).manual_seed(0)
    out = []
    for shape, dt, stride in sig:
        t = torch.empty_strided(shape, stride, dtype=dt, device=device)
        out.append(t.normal_(generator=gen) if dt.is_floating_point else t.random_(0, 16, generator=gen))
    return out


# An op's free dims: (input index, dim) pairs along which one kernel may serve other sizes (a decode step's key and
# value length), each such signature proven on its own before it serves.
FreeDims = tuple[tuple[int, int], ...]


def dense_order(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, ...] | None:
    """A tensor's dims of size above one, outermost first, where its memory is dense in that order (no gaps, no
    overlap); None where it is not. Two tensors with the same order are laid out alike whatever their sizes."""
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: stride[d], reverse=True)
    expected = 1
    for d in reversed(dims):
        if stride[d] != expected:
            return None
        expected *= shape[d]
    return tuple(dims)


def provable_at(free: FreeDims, problem: Signature, call: Signature) -> bool:
    """Whether a kernel verified at ``problem`` may serve ``call`` once it is proven there against the stack's own
    computation: the same inputs and dtypes, the same sizes but for the free dims' (a decode step's cache length),
    and each input laid out as in the problem or densely in any order. A stack's rotary embedding returns the
    queries in the projection's layout, a kernel's may return them contiguous: the attention after it meets the
    same values laid out otherwise. An input with gaps or overlaps (a slice of a longer cache, an expanded view)
    is served only as the problem had it."""
    if len(problem) != len(call) or problem == call:
        return False
    by_input: dict[int, set[int]] = {}
    for i, d in free:
        by_input.setdefault(i, set()).add(d)
    for i, (p, c) in enumerate(zip(problem, call)):
        (pshape, pdt, pstride), (cshape, cdt, cstride) = p, c
        if pdt != cdt or len(pshape) != len(cshape):
            return False
        dims = by_input.get(i, set())
        if any(a != b for d, (a, b) in enumerate(zip(pshape, cshape)) if d not in dims):
            return False
        if pshape == cshape and pstride == cstride:
            continue
        if dense_order(pshape, pstride) is None or dense_order(cshape, cstride) is None:
            return False
    return True


def free_bucket(free: FreeDims, sig: Signature) -> tuple[Any, ...]:
    """Where a kernel's speed against the stack's own path is judged once: the sizes of a signature's free dims,
    each rounded up to a power of two, and each input's dense order (a layout can be slower to read)."""
    sizes = tuple(1 << max(0, int(sig[i][0][d]) - 1).bit_length() for i, d in free)
    return sizes, tuple(dense_order(shape, stride) for shape, _, stride in sig)
