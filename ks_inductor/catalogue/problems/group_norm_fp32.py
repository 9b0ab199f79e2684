"""Group norm with affine weight and bias, fp32, at a vision-model size: few groups, each millions of values long."""
import torch
import torch.nn as nn

batch_size = 4
channels = 64
groups = 8
height = width = 256


class Model(nn.Module):
    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [groups, channels]
