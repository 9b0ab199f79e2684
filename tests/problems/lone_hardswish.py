"""A lone pointwise activation."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.hardswish(x)


def get_inputs():
    return [torch.randn(16, 300)]


def get_init_inputs():
    return []
