import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, junk_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """An honest kernel handed a 200 MB tensor of the model's that it never reads: the plan carries every tensor its
    launches take, and the judge would copy and load whatever size the candidate's process wrote."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("junk", torch.ones(50_000_000))

    def forward(self, x):
        x2 = x.contiguous().view(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n = x2.shape[-1]
        _rmsnorm_kernel[(x2.shape[0],)](x2, self.weight, out, self.junk, n, self.eps, BLOCK=triton.next_power_of_2(n))
        return out.view(x.shape)
