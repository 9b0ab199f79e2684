"""The residual + RMSNorm model several backend tests compile: one region with two outputs (the sum and the norm).
It imports torch only, so a child process can use it without pulling in what the tests import."""

import torch
import torch.nn as nn


class NormResidual(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x, r):
        x = x + r
        xf = x.float()
        return x, (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w
