"""3-D max pooling with overlapping windows (kernel 3, stride 2, padding 1), fp32, a video-model activation."""
import torch
import torch.nn as nn

batch_size = 8
channels = 32
depth = height = width = 64


class Model(nn.Module):
    def __init__(self, kernel: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool3d(kernel, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return [3, 2, 1]
