"""Which compiled kernels a launch plan hands to torch's static CUDA launcher (``integrations.static_launch``).

Triton compiles for an sm_90 target on any machine (its wheel carries ptxas), so the kernels here are real
``CompiledKernel`` objects with real cubins; loading and launching them needs a GPU (``tests/test_launch_plan.py``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from integrations.static_launch import _arg_types, static_kernel

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def scale(X, W, Y, n, cols, alpha, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(Y + i, tl.load(X + i, mask=m) * tl.load(W + i % cols, mask=m) * alpha, mask=m)


@triton.jit
def flipped(X, Y, n, flip, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(X + i, mask=m)
    tl.store(Y + i, tl.where(flip, -x, x), mask=m)
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = tmp_path_factory.mktemp("static") / "static_kernels.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("static_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")  # compiled kernels, also where the suite runs under the interpreter
        spec.loader.exec_module(mod)
    target = GPUTarget("cuda", 90, 32)
    scale = triton.compile(ASTSource(mod.scale, signature={
        "X": "*fp32", "W": "*fp32", "Y": "*fp32", "n": "i32", "cols": "i32", "alpha": "fp32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 1024}), target=target)
    flipped = triton.compile(ASTSource(mod.flipped, signature={
        "X": "*fp32", "Y": "*fp32", "n": "i32", "flip": "i1", "BLOCK": "constexpr"}, constexprs={"BLOCK": 256}),
        target=target)
    return scale, flipped


def test_the_launcher_gets_the_runtime_arguments_and_their_types(kernels):
    scale, _ = kernels
    assert "cubin" in scale.asm
    # pointers, two 32-bit ints and a float; the constexpr BLOCK (position 6) is compiled in and left out
    assert _arg_types(scale) == ("OOOiif", (0, 1, 2, 3, 4, 5), 7)


def test_a_bool_scalar_keeps_tritons_launcher(kernels):
    _, flipped = kernels
    assert _arg_types(flipped) is None
    assert static_kernel(flipped, 0) == (None, "a scalar type the static launcher passes differently")


def test_an_eligible_kernel_needs_the_launcher_in_torch(kernels):
    scale, _ = kernels
    if hasattr(torch._C, "_StaticCudaLauncher"):
        pytest.skip("this torch has the static launcher; loading a cubin needs a GPU (test_launch_plan.py)")
    assert static_kernel(scale, 0) == (None, "this torch has no static CUDA launcher")
