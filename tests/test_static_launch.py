"""Which compiled kernels a launch plan hands to torch's static CUDA launcher (``integrations.static_launch``).

Triton compiles for an sm_90 target on any machine (its wheel carries ptxas), so the kernels here are real
``CompiledKernel`` objects with real cubins; loading and launching them needs a GPU (``tests/test_launch_plan.py``).
They are compiled in a process of their own: where the suite has run the Triton interpreter, it has patched
``triton.language`` for itself, and a compilation in that process fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

KERNELS = '''
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

PROBE = '''
import importlib.util, json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from integrations.static_launch import _arg_types, static_kernel

spec = importlib.util.spec_from_file_location("static_kernels", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
target = GPUTarget("cuda", 90, 32)
scale = triton.compile(ASTSource(mod.scale, signature={
    "X": "*fp32", "W": "*fp32", "Y": "*fp32", "n": "i32", "cols": "i32", "alpha": "fp32", "BLOCK": "constexpr"},
    constexprs={"BLOCK": 1024}), target=target)
flipped = triton.compile(ASTSource(mod.flipped, signature={
    "X": "*fp32", "Y": "*fp32", "n": "i32", "flip": "i1", "BLOCK": "constexpr"}, constexprs={"BLOCK": 256}),
    target=target)
print(json.dumps({
    "cubin": "cubin" in scale.asm,
    "scale_types": _arg_types(scale),
    "flipped_types": _arg_types(flipped),
    "flipped": static_kernel(flipped, 0)[1],
    "scale": static_kernel(scale, 0)[1] if not hasattr(torch._C, "_StaticCudaLauncher") else None,
}))
'''


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    kernels = tmp_path_factory.mktemp("static") / "static_kernels.py"
    kernels.write_text(KERNELS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", PROBE, str(kernels)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_launcher_gets_the_runtime_arguments_and_their_types(probed):
    assert probed["cubin"]
    # pointers, two 32-bit ints and a float; the constexpr BLOCK (position 6) is compiled in and left out
    assert probed["scale_types"] == ["OOOiif", [0, 1, 2, 3, 4, 5], 7]


def test_a_bool_scalar_keeps_tritons_launcher(probed):
    assert probed["flipped_types"] is None
    assert probed["flipped"] == "a scalar type the static launcher passes differently"


def test_an_eligible_kernel_needs_the_launcher_in_torch(probed):
    if probed["scale"] is None:
        pytest.skip("this torch has the static launcher; loading a cubin needs a GPU (test_launch_plan.py)")
    assert probed["scale"] == "this torch has no static CUDA launcher"
