"""Attention problems: decode over a key/value cache (``DECODE``, ``decode_problem``) and causal prefill in the
spellings models write it (``PREFILL_PROBLEMS``, ``prefill_source``), with the ones each family must decline."""

from __future__ import annotations

from ks_core.problem_record import Problem
from ks_inductor.problem_tracing import problem_from_source

DECODE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, P, NH, KV, D = {B}, {T}, {P}, {NH}, {KV}, {D}
DT = torch.{dtype}


def rot(x):
    return torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)


class Model(nn.Module):
    def forward(self, xq, xk, xv, cos, sin, kc, vc):
        q = xq.view(B, T, NH, D).transpose(1, 2)
        k = xk.view(B, T, KV, D).transpose(1, 2)
        v = xv.view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k = torch.cat([kc, k], 2)
        v = torch.cat([vc, v], 2)
        a = F.scaled_dot_product_attention(q, k, v, {extra}enable_gqa=True)
        return a.transpose(1, 2).reshape(B, T, NH * D)


def get_inputs():
    ang = torch.rand(1, 1, T, D) * 6
    return [torch.randn(B, T, NH * D, dtype=DT), torch.randn(B, T, KV * D, dtype=DT),
            torch.randn(B, T, KV * D, dtype=DT), ang.cos().to(DT), ang.sin().to(DT),
            torch.randn(B, KV, P, D, dtype=DT), torch.randn(B, KV, P, D, dtype=DT)]


def get_init_inputs():
    return []
'''

PLAIN = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.3)


def get_inputs():
    return [torch.randn(2, 3, 3, 32), torch.randn(2, 3, 24, 32), torch.randn(2, 3, 24, 32)]


def get_init_inputs():
    return []
'''


# The decode family's problems: decode with RoPE and a cache, plain attention, and the masks the template does not
# write.
DECODE_PROBLEMS = {
    "decode_attention_rope_cache": (DECODE.format(B=2, T=1, P=40, NH=4, KV=2, D=16, dtype="float32", extra=""),
                                    "attention"),
    "attention_no_cache": (PLAIN, "attention"),
    "causal_attention_is_not_here": (
        DECODE.format(B=2, T=1, P=40, NH=4, KV=2, D=16, dtype="float32", extra="is_causal=True, "), None),
}


def decode_problem(dtype: str = "float32", B: int = 2, T: int = 1, P: int = 40, NH: int = 4, KV: int = 2, D: int = 16,
                   extra: str = "") -> Problem:
    """Decode attention over a cache of ``P`` keys, RoPE on q and k, grouped heads; ``extra``: more SDPA arguments."""
    src = DECODE.format(B=B, T=T, P=P, NH=NH, KV=KV, D=D, dtype=dtype, extra=extra)
    return problem_from_source(src, name=f"decode_attn_{dtype}_T{T}")


HEADER = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, NH, KV, D = {B}, {T}, {NH}, {KV}, {D}
DT = torch.{dtype}
'''

FOOTER = '''

def get_inputs():
    return [torch.randn(B, NH, T, D, dtype=DT), torch.randn(B, KV, T, D, dtype=DT),
            torch.randn(B, KV, T, D, dtype=DT)]


def get_init_inputs():
    return []
'''

SDPA = '''

class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
''' + FOOTER

# transformers' SDPA path where enable_gqa is not used: k and v repeated per group before the call.
SDPA_REPEATED = '''

class Model(nn.Module):
    def forward(self, q, k, v):
        k = k[:, :, None].expand(B, KV, NH // KV, T, D).reshape(B, NH, T, D)
        v = v[:, :, None].expand(B, KV, NH // KV, T, D).reshape(B, NH, T, D)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
''' + FOOTER

# A decoder layer's prefill region: RoPE on q and k, the (empty) key/value cache in front, heads out last.
ROPE = '''

def rot(x):
    return torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)


class Model(nn.Module):
    def forward(self, xq, xk, xv, cos, sin, kc, vc):
        q = xq.view(B, T, NH, D).transpose(1, 2)
        k = xk.view(B, T, KV, D).transpose(1, 2)
        v = xv.view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k = torch.cat([kc, k], 2)
        v = torch.cat([vc, v], 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return a.transpose(1, 2).reshape(B, T, NH * D)


def get_inputs():
    ang = torch.rand(1, 1, T, D) * 6
    return [torch.randn(B, T, NH * D, dtype=DT), torch.randn(B, T, KV * D, dtype=DT),
            torch.randn(B, T, KV * D, dtype=DT), ang.cos().to(DT), ang.sin().to(DT),
            torch.randn(B, KV, 0, D, dtype=DT), torch.randn(B, KV, 0, D, dtype=DT)]


def get_init_inputs():
    return []
'''

# transformers' eager Llama attention: repeat_kv, a finfo.min causal mask added, softmax in fp32.
LLAMA = '''

def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class Model(nn.Module):
    def forward(self, q, k, v):
        k = repeat_kv(k, NH // KV)
        v = repeat_kv(v, NH // KV)
        w = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
        mask = torch.full((T, T), torch.finfo(DT).min, dtype=DT, device=q.device).triu(1)[None, None]
        w = F.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v).transpose(1, 2).reshape(B, T, NH * D)
''' + FOOTER

# nanoGPT's: a lower-triangular condition, masked_fill with -inf, heads split from the hidden dim.
NANOGPT = '''

class Model(nn.Module):
    def forward(self, xq, xk, xv):
        q = xq.view(B, T, NH, D).transpose(1, 2)
        k = xk.view(B, T, NH, D).transpose(1, 2)
        v = xv.view(B, T, NH, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        causal = torch.ones(T, T, device=xq.device).tril().view(1, 1, T, T)
        att = F.softmax(att.masked_fill(causal == 0, float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, NH * D)


def get_inputs():
    return [torch.randn(B, T, NH * D, dtype=DT) for _ in range(3)]


def get_init_inputs():
    return []
'''

# repeat_interleave for the groups, a triu of -inf added, softmax in the input's dtype.
INTERLEAVE = '''

class Model(nn.Module):
    def forward(self, q, k, v):
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * 0.2
        s = s + torch.triu(torch.full((T, T), float("-inf"), dtype=DT, device=q.device), diagonal=1)
        return torch.softmax(s, dim=-1) @ v
''' + FOOTER


def by_hand(mask_line: str, extra_input: bool = False) -> str:
    """Attention written out with the mask of ``mask_line`` (``s`` the scaled scores, ``m`` an input mask)."""
    inputs = "q, k, v, m" if extra_input else "q, k, v"
    footer = FOOTER.replace("torch.randn(B, KV, T, D, dtype=DT)]", "torch.randn(B, KV, T, D, dtype=DT), "
                            "torch.full((T, T), float('-inf')).triu(1)]") if extra_input else FOOTER
    return f'''

class Model(nn.Module):
    def forward(self, {inputs}):
        s = q @ k.transpose(-1, -2) * 0.25
{mask_line}
        return torch.softmax(s, dim=-1) @ v
''' + footer


def prefill_source(body: str, dtype: str = "float32", B: int = 1, T: int = 37, NH: int = 2, KV: int = 1, D: int = 16) -> str:
    return HEADER.format(B=B, T=T, NH=NH, KV=KV, D=D, dtype=dtype) + body


# The causal prefill family's problems. Sequences of 37 and 50: no block divides them.
PREFILL_PROBLEMS = {
    "prefill_sdpa_gqa": (prefill_source(SDPA), "attention_prefill"),
    "prefill_sdpa_rope_empty_cache_bf16": (prefill_source(ROPE, "bfloat16", T=50, D=32), "attention_prefill"),
    "prefill_sdpa_repeated_kv_fp16": (prefill_source(SDPA_REPEATED, "float16", NH=4, KV=2, T=50), "attention_prefill"),
    "prefill_llama_eager_bf16": (prefill_source(LLAMA, "bfloat16"), "attention_prefill"),
    "prefill_nanogpt_fp32": (prefill_source(NANOGPT, T=50, KV=2, D=32), "attention_prefill"),
    "prefill_repeat_interleave_fp16": (prefill_source(INTERLEAVE, "float16", B=2), "attention_prefill"),
    # a sliding window: keys more than 8 back are masked too
    "prefill_sliding_window_is_not_here": (prefill_source(by_hand(
        "        i = torch.arange(T, device=q.device)\n"
        "        far = (i[None, :] > i[:, None]) | (i[None, :] < i[:, None] - 8)\n"
        "        s = s.masked_fill(far, float('-inf'))"), B=1), None),
    # the diagonal masked as well: the first row has no key at all
    "prefill_strict_mask_is_not_here": (prefill_source(by_hand(
        "        s = s + torch.full((T, T), float('-inf'), device=q.device).triu(0)")), None),
    # a mask that comes in as data may be anything
    "prefill_input_mask_is_not_here": (prefill_source(by_hand("        s = s + m", extra_input=True)), None),
    # a mask of -1e4 does not silence a score of 1e4 (x100 inputs): not exactly causal
    "prefill_shallow_mask_is_not_here": (prefill_source(by_hand(
        "        s = s + torch.full((T, T), -1e4, device=q.device).triu(1)")), None),
}
