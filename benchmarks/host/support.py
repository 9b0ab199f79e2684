"""Helpers for the host-side benchmarks (pytest-benchmark, CPU); the fixture lives in conftest.py.

Run them with::

    pytest benchmarks/host -o python_files='bench_*.py' --benchmark-enable

Cached kernels run on the Triton interpreter here, so the set-up makes a real cache hit: it compiles a tiny
model once with ``on_miss="record"``, stores a Triton kernel for the recorded region as a verified
(interpreter) kernel, and hands out the database URL. Everything skips with the reason when the backend is not
importable or does not swap the kernel in.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

AFFINE_KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _affine(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _affine[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        return out
'''


def affine_model():
    import torch.nn as nn

    class Affine(nn.Module):
        def forward(self, x):
            return x * 2.0 + 1.0

    return Affine()


def backend_options(db: str, on_miss: str = "fallback") -> dict:
    return {"kernelsmith.db": db, "kernelsmith.on_miss": on_miss, "kernelsmith.judge": "triton-interpret"}


def reset_compilers() -> None:
    import torch

    torch._dynamo.reset()
