"""Region ops through torch.library: the schema a triton_op infers, and what each registration runs."""

import pytest
import torch

from kernel_cache.record import KernelRecord
from ks_inductor.compiler.kernel_ops import (
    KernelLoadError,
    OpSpec,
    register_region_op,
    served_kernel,
    typed_signature,
)

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


@pytest.mark.parametrize("triton", [True, False])
def test_without_a_judged_plan_there_is_no_op(triton: bool) -> None:
    """Either registration runs (or traces) a judged plan, never a forward: a kernel without one gets no op, and its
    region stays with Inductor."""
    record = KernelRecord(problem_key="axpy-test", source=SOURCE, backend="cpu", fingerprint={})
    kernel = served_kernel(record)
    spec = OpSpec(["Tensor", "Tensor", "float"], 1, [torch.float32])
    with pytest.raises(KernelLoadError, match="only its judged plan runs, and it has none"):
        register_region_op(kernel, "axpy-test", lambda x, y, a: a * x + y, spec, triton=triton)


def test_served_kernel_modules_live_in_kernelsmiths_home(tmp_path, monkeypatch):
    """A compile writes its served kernels' modules beside the cache, in kernelsmith's home, never in the temp
    folder where nobody asked for them."""
    from ks_inductor.compiler.kernel_ops import _kernel_dir

    monkeypatch.delenv("KERNELSMITH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _kernel_dir() == tmp_path / "xdg" / "kernelsmith" / "kernels" and _kernel_dir().is_dir()
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    assert _kernel_dir() == tmp_path / "home" / "kernels"


def test_a_layout_inductor_would_pad_is_named():
    """A traced kernel takes the layout its plan was judged at; where Inductor may pad a buffer's rows (a row
    longer than its padding threshold and not a multiple of its alignment), the region is not traced."""
    from ks_inductor.compiler.kernel_ops import padded_by_inductor

    assert padded_by_inductor([torch.empty(4, 2048, dtype=torch.bfloat16), torch.empty(2048)]) == ""
    assert padded_by_inductor([torch.empty(16, 1, 2048, dtype=torch.bfloat16), 1e-6]) == ""
    assert padded_by_inductor([torch.empty(64, 1000)]) == ""  # under the threshold: left as it is
    why = padded_by_inductor([torch.empty(2048), torch.empty(4, 2047, dtype=torch.bfloat16)])
    assert why == "input 1's stride 2047 is one Inductor pads to a multiple of 64"
