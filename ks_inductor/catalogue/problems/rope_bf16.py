"""Rotary position embedding (rotate-half form) applied to q and k, bf16; q has 32 heads, k has 8."""
import torch
import torch.nn as nn

batch_size = 1
q_heads = 32
k_heads = 8
seq_len = 4096
head_dim = 128


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c = cos.unsqueeze(1)
        s = sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def get_inputs():
    q = torch.randn(batch_size, q_heads, seq_len, head_dim, dtype=torch.bfloat16)
    k = torch.randn(batch_size, k_heads, seq_len, head_dim, dtype=torch.bfloat16)
    pos = torch.arange(seq_len).float()
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(pos, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return [q, k, emb.cos()[None].to(torch.bfloat16), emb.sin()[None].to(torch.bfloat16)]


def get_init_inputs():
    return []
