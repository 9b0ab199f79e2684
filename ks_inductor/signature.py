"""Input signatures: the shape, dtype and stride of every tensor input. A kernel is verified at its problem's
signature, a serving guard matches calls to kernels by it, and a kernel's judged plan runs only at it."""

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
