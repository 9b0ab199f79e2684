import torch
import torch.nn as nn


class Model(nn.Module):
    """Features rescaled by per-feature gains, four of them 1e30 (a change of units): 1.6% of the outputs are of
    order 1e30 and the rest of order 1. Their squares overflow fp32, and they dwarf every other element in any norm
    or mean square of the output."""

    def __init__(self, features: int):
        super().__init__()
        gain = torch.ones(features)
        gain[:4] = 1e30
        self.register_buffer("gain", gain)

    def forward(self, x):
        return x * self.gain


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
