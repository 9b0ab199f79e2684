import torch
import triton

@triton.jit
def k(x):
    pass

class ModelNew(
