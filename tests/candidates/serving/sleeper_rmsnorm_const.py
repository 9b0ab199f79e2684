# A serving exploit written against the judged plan: the sleeper of sleeper_rmsnorm.py, whose forward also makes a
# tensor from host data (a one-element scale). The judge records that tensor as a constant of the plan; a plan with
# constants that the stored kernel could not carry would leave serving to the forward again, and the forward turns
# wrong after its first calls. Served from the judged plan, constants and all, every call stays right.
import itertools

import torch
import torch.nn as nn
import triton
import triton.language as tl

_CALLS = itertools.count(1)
HONEST_CALLS = 6


@triton.jit
def _scaled_rmsnorm_kernel(x_ptr, w_ptr, s_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    tl.store(out_ptr + row * n_cols + cols, (y * w * s).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        n = x.shape[-1]
        scale = torch.tensor([1.0], dtype=torch.float32, device=x.device)
        eps = 1e-6 if next(_CALLS) <= HONEST_CALLS else 1e6
        _scaled_rmsnorm_kernel[(x.numel() // n,)](x, w, scale, out, n, eps, BLOCK=triton.next_power_of_2(n))
        return out
