"""One decode step of grouped-query attention, bf16: 16 sequences, 1 new token each over 2048 cached positions,
32 query heads sharing 8 key/value heads, head dim 128. The new q and k rows are rotated (RoPE) and the new key
and value rows are appended to the cache, as in a Llama-style layer (shared/anchors/measure_layer.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
new_tokens = 1
cached = 2048
q_heads = 32
kv_heads = 8
head_dim = 128


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, cos, sin, k_cache, v_cache):
        b, t = q.shape[0], q.shape[1]
        q = q.view(b, t, q_heads, head_dim).transpose(1, 2)
        k = k.view(b, t, kv_heads, head_dim).transpose(1, 2)
        v = v.view(b, t, kv_heads, head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = torch.cat([k_cache, k * cos + rotate_half(k) * sin], 2)
        v = torch.cat([v_cache, v], 2)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return a.transpose(1, 2).reshape(b, t, q_heads * head_dim)


def get_inputs():
    pos = torch.arange(cached, cached + new_tokens).float()
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(pos, inv)
    emb = torch.cat([ang, ang], -1)[None, None]
    bf = torch.bfloat16
    return [torch.randn(batch_size, new_tokens, q_heads * head_dim, dtype=bf),
            torch.randn(batch_size, new_tokens, kv_heads * head_dim, dtype=bf),
            torch.randn(batch_size, new_tokens, kv_heads * head_dim, dtype=bf),
            emb.cos().to(bf), emb.sin().to(bf),
            torch.randn(batch_size, kv_heads, cached, head_dim, dtype=bf),
            torch.randn(batch_size, kv_heads, cached, head_dim, dtype=bf)]


def get_init_inputs():
    return []
