"""SwiGLU activation: SiLU(gate) * up, bf16 (the MLP of Llama-style models)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 14336


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.bfloat16), torch.randn(batch_size, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
