"""A GEMM with a pointwise epilogue: GELU(tanh)(a @ b), bf16, as in a transformer MLP up-projection."""
import torch
import torch.nn as nn
import torch.nn.functional as F

M = 4096
K = 4096
N = 14336


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(a @ b, approximate="tanh")


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
