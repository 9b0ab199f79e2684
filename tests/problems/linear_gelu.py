"""A linear layer (addmm) with its bias and an exact GELU: a GEMM-led region whose seed is Inductor's Triton mm
template with the bias and GELU fused as its epilogue."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 96)

    def forward(self, x):
        return F.gelu(self.fc(x))


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
