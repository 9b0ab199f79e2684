import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, g_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    g = tl.load(g_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, x * g, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("gain", torch.ones(features))

    def forward(self, x):
        x2 = x.contiguous().view(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n = x2.shape[-1]
        _scale[(x2.shape[0],)](x2, self.gain, out, n, BLOCK=triton.next_power_of_2(n))
        return out.view(x.shape)
