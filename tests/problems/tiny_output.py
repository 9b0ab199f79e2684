import torch
import torch.nn as nn


class Model(nn.Module):
    """Outputs around 1e-7: an all-zero answer sits inside any absolute tolerance."""

    def forward(self, x):
        return torch.tanh(x) * 1e-7


def get_inputs():
    return [torch.randn(32, 64)]


def get_init_inputs():
    return []
