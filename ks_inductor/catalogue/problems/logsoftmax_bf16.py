"""Log-softmax over a 128k vocabulary of bf16 logits: few rows, each longer than one program's registers hold."""
import torch
import torch.nn as nn

batch_size = 256
vocab = 131072


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, vocab, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
