"""A LlamaRMSNorm layer at (2, 8, 64) float32, its input, and its own output: what the serving tests build packs
for and serve."""

from __future__ import annotations

import torch

HIDDEN = 64
SHAPE = (2, 8, HIDDEN)


def norm_layer() -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(HIDDEN).eval()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
    return norm


def hidden() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))


def own_output(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    with torch.no_grad():
        return LlamaRMSNorm.forward(norm, x)
