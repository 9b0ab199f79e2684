"""Input signatures: the shape, dtype and stride of every input, which is what a pack kernel was verified for.

The guard matches calls to kernels by signature; ``ops`` traces a layer's own computation at one; both build
them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Signature = tuple[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]], ...]


def dtype_named(name: str) -> torch.dtype | None:
    """The torch dtype a problem's spec names (``"float32"``); None for anything else."""
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


def spec_signature(specs: Sequence[Any]) -> Signature | None:
    """The signature a problem's input specs describe; None when an input is not a tensor of a known dtype."""
    out = []
    for s in specs:
        dt = dtype_named(s.dtype or "") if s.kind == "tensor" else None
        if dt is None:
            return None
        out.append((tuple(s.shape or ()), dt, tuple(s.stride or ())))
    return tuple(out)


def call_signature(args: Sequence[torch.Tensor]) -> Signature:
    """The signature of a call's tensors."""
    return tuple((tuple(a.shape), a.dtype, tuple(a.stride())) for a in args)


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
