"""A decode step's projection: 16 token rows through a 4096 x 11008 bf16 linear layer without bias."""
import torch
import torch.nn as nn

tokens = 16
hidden = 4096
intermediate = 11008


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.proj = nn.Linear(hidden, intermediate, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def get_inputs():
    return [torch.randn(tokens, hidden, dtype=torch.bfloat16)]


def get_init_inputs():
    return [hidden, intermediate]
