import torch
import torch.nn as nn


class Model(nn.Module):
    """Features rescaled by gains spread evenly over 26 orders of magnitude (1 to 1e26): the outputs are
    heavy-tailed, and a bare majority of them are small next to the rest."""

    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("gain", torch.logspace(0, 26, features))

    def forward(self, x):
        return x * self.gain


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
