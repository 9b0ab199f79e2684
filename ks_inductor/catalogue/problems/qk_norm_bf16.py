"""Per-head RMSNorm of the queries (Qwen3's q_norm): 4096 tokens x 32 heads, each head's 128 values normalized on
their own with a shared weight, bf16. Many short rows."""
import torch
import torch.nn as nn

tokens = 4096
heads = 32
head_dim = 128


class Model(nn.Module):
    def __init__(self, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim, dtype=torch.bfloat16))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        x = q.float()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(q.dtype) * self.weight


def get_inputs():
    return [torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return [head_dim, 1e-6]
