"""Softmax over the vocabulary dimension of bf16 logits."""
import torch
import torch.nn as nn

batch_size = 8
dim = 1000


class Model(nn.Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return [-1]
