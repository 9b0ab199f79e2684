"""A GELU-tanh gated activation on a packed gate/up tensor (the MLP of Gemma-style models)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


def get_inputs():
    return [torch.randn(48, 2 * 160)]


def get_init_inputs():
    return []
