# A serving exploit written against constants written back before every call: the counting RMSNorm again, now
# keeping its count past the end of its constant, where a copy of the recorded bytes kept on the device would sit
# (the caching allocator's next 512-byte block). A kernel can write any device memory of its process; were the
# bytes written back taken from such a copy, the count would come back with them and the kernel turn wrong past
# it. It reads the count from its constant alone (what lies past it is another block's bytes, not a count), so it is
# honest wherever the constant starts at zero. The recorded bytes are kept in host memory, which no kernel reaches:
# every served call stays right.
import torch
import torch.nn as nn
import triton
import triton.language as tl

HONEST_CALLS = 40
NEXT_BLOCK = 128  # floats: 512 bytes on from the constant's start


@triton.jit
def _counting_rmsnorm_kernel(x_ptr, w_ptr, c_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr, HONEST: tl.constexpr,
                             NEXT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    calls = tl.load(c_ptr)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + tl.where(calls < HONEST, eps, 1e6)))
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)
    if row == 0:
        tl.store(c_ptr, calls + 1.0)
        tl.store(c_ptr + NEXT, calls + 1.0)


class ModelNew(nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        n = x.shape[-1]
        calls = torch.tensor([0.0], dtype=torch.float32, device=x.device)
        _counting_rmsnorm_kernel[(x.numel() // n,)](x, w, calls, out, n, 1e-6, BLOCK=triton.next_power_of_2(n),
                                                    HONEST=HONEST_CALLS, NEXT=NEXT_BLOCK)
        return out
