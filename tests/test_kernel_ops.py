"""Region ops through torch.library: the triton_op variant (what a GPU uses) registers and runs."""

import torch

from kernel_cache.record import KernelRecord
from ks_inductor.compiler.kernel_ops import OpSpec, load_kernel, register_region_op, typed_signature

SOURCE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


class ModelNew(nn.Module):
    def forward(self, x, y, a):
        out = torch.empty_like(x)
        n = x.numel()
        _axpy[(triton.cdiv(n, 64),)](x, y, out, a, n, BLOCK=64)
        return out
'''


def test_typed_signature_gives_back_the_schema() -> None:
    from torch._library.infer_schema import infer_schema

    for spec in (OpSpec(["Tensor", "SymInt", "float", "bool"], 1, [torch.float32]),
                 OpSpec(["Tensor", "Tensor"], 2, [torch.float32, torch.float32])):
        def fn(*args):
            return args

        fn.__signature__ = typed_signature(spec)
        assert infer_schema(fn, mutates_args=()) == spec.schema()


def test_triton_op_variant_registers_and_runs() -> None:
    # torch.library.triton_op infers its schema from the function and ignores the one passed: a *args launcher
    # fails here on every GPU compile, and every hit would fall back to Inductor.
    record = KernelRecord(problem_key="axpy-test", source=SOURCE, backend="cpu", fingerprint={})
    kernel = load_kernel(record, wrap_triton=True)
    spec = OpSpec(["Tensor", "Tensor", "float"], 1, [torch.float32])
    op = register_region_op(kernel, "axpy-test", lambda x, y, a: a * x + y, spec, triton=True)
    x, y = torch.randn(300), torch.randn(300)
    torch.testing.assert_close(op(x, y, 2.5), 2.5 * x + y)
    assert register_region_op(kernel, "axpy-test", lambda x, y, a: a * x + y, spec, triton=True) is op


def test_served_kernel_modules_live_in_kernelsmiths_home(tmp_path, monkeypatch):
    """A compile writes its served kernels' modules beside the cache, in kernelsmith's home, never in the temp
    folder where nobody asked for them."""
    from ks_inductor.compiler.kernel_ops import _kernel_dir

    monkeypatch.delenv("KERNELSMITH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _kernel_dir() == tmp_path / "xdg" / "kernelsmith" / "kernels" and _kernel_dir().is_dir()
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    assert _kernel_dir() == tmp_path / "home" / "kernels"
