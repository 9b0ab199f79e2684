"""Causal prefill attention with grouped queries, bf16: 4 sequences of 1024 tokens, 32 query heads sharing 8
key/value heads, head dim 128, as the attention of a Llama-style layer's prefill (shared/anchors/measure_layer.py)
sees it after its projections and RoPE."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4
seq_len = 1024
q_heads = 32
kv_heads = 8
head_dim = 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return a.transpose(1, 2).reshape(q.shape[0], q.shape[2], q_heads * head_dim)


def get_inputs():
    q = torch.randn(batch_size, q_heads, seq_len, head_dim, dtype=torch.bfloat16)
    k = torch.randn(batch_size, kv_heads, seq_len, head_dim, dtype=torch.bfloat16)
    v = torch.randn(batch_size, kv_heads, seq_len, head_dim, dtype=torch.bfloat16)
    return [q, k, v]


def get_init_inputs():
    return []
