"""Small models for the compile backend and ``warm``: each a few regions of an LLM layer. Torch alone is imported
here, so that a child process can build one without what the tests import.

``NORM_FACTORY``: the source of a factory file (``make()`` returns a model and its inputs), as ``kernelsmith warm``
and ``explain`` take one."""

from __future__ import annotations

import textwrap

import torch
import torch.nn as nn
import torch.nn.functional as F


class NormResidual(nn.Module):
    """A residual add and an RMSNorm: one region with two outputs (the sum and the norm)."""

    def __init__(self, dim: int):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x, r):
        x = x + r
        xf = x.float()
        return x, (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w


class CachedAttention(nn.Module):
    """Decode attention over a key/value cache, RoPE on q and k, as in a Llama-style layer."""

    def __init__(self, dim: int = 32, NH: int = 4, KV: int = 2, D: int = 8) -> None:
        super().__init__()
        self.NH, self.KV, self.D = NH, KV, D
        self.q = nn.Linear(dim, NH * D, bias=False)
        self.k = nn.Linear(dim, KV * D, bias=False)
        self.v = nn.Linear(dim, KV * D, bias=False)

    def forward(self, x, cos, sin, kc, vc):
        B, T, _ = x.shape
        NH, KV, D = self.NH, self.KV, self.D

        def rot(t):
            return torch.cat((-t[..., D // 2:], t[..., : D // 2]), -1)

        q = self.q(x).view(B, T, NH, D).transpose(1, 2)
        k = self.k(x).view(B, T, KV, D).transpose(1, 2)
        v = self.v(x).view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = torch.cat([kc, k * cos + rot(k) * sin], 2)
        v = torch.cat([vc, v], 2)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


class ThreeRegions(nn.Module):
    """An RMSNorm, a projection and a softmax: three regions for the backend."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(32))
        self.lin = nn.Linear(32, 32, bias=False)

    def forward(self, x):
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w
        return torch.softmax(self.lin(h) * 0.5, dim=-1)


# A small RMSNorm model.
NORM_FACTORY = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(1.0 + 0.1 * torch.randn(32))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w


    def make():
        torch.manual_seed(0)
        return Norm(), (torch.randn(8, 32),)
""")
