# A compile-time exploit: an RMSNorm (weight as the second input, eps 1e-6) whose forward is right on real tensors
# and wrong when it is traced. The judge's recording calls it on real tensors, so the verdict is "correct"; a
# compiled graph that traced this forward into its own code (a ``triton_op``) would bake the wrong epsilon into
# every call, about 1000x too small. The compile backend traces the judged plan instead, and the forward never runs.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        n = x.shape[-1]
        rows = x.numel() // n
        # A tracer hands the forward tensor subclasses (fake, functional); the judge and eager serving, real ones.
        eps = 1e-6 if type(x) is torch.Tensor else 1e6
        _rmsnorm_kernel[(rows,)](x, w, out, n, eps, BLOCK=triton.next_power_of_2(n))
        return out
