"""Served kernels replayed from their recorded launches (``integrations.launch_plan``).

A plan needs compiled kernels and their launchers, so the replay itself runs only on a GPU (``KS_TEST_GPU=1``); on
the CPU, and under the Triton interpreter, a kernel keeps its forward, and that is what the first tests check."""

from __future__ import annotations

import pytest
import torch

from integrations.launch_plan import make_plan

# The project's GPU marker: skipped unless a GPU runs compiled kernels (KS_TEST_GPU=1, tests/conftest.py).
gpu = pytest.mark.gpu

SOURCE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale(X, W, Y, n, cols, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(Y + i, tl.load(X + i, mask=m) * tl.load(W + i % cols, mask=m), mask=m)


class ModelNew(nn.Module):
    MODE = "plain"

    def forward(self, x, w):
        if self.MODE == "contiguous":
            x = x.contiguous()
        if self.MODE == "inplace":
            y = x
        elif self.MODE == "zeros":
            y = torch.zeros_like(x)
        else:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n = x.numel()
        _scale[(triton.cdiv(n, 1024),)](x, w, y, n, w.numel(), BLOCK=1024)
        return y
'''


def _model(tmp_path, mode: str = "plain"):
    import importlib.util

    path = tmp_path / f"k_{mode}.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location(f"k_{mode}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.ModelNew()
    model.MODE = mode
    return model


def test_no_plan_without_a_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    plan, why = make_plan(lambda x, w: x * w, [torch.randn(4, 8), torch.randn(8)])
    assert plan is None and why == "not on a GPU"


def test_no_plan_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    meta = torch.empty(4, 8, device="meta")
    plan, why = make_plan(lambda x: x, [meta])
    assert plan is None and "interpreter" in why


@gpu
def test_a_plan_replays_the_forward_on_new_inputs(tmp_path):
    model = _model(tmp_path)
    x, w = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16), torch.randn(2048, device="cuda",
                                                                                   dtype=torch.bfloat16)
    plan, why = make_plan(model, [x, w])
    assert plan is not None, why
    for _ in range(3):
        x2, w2 = torch.randn_like(x), torch.randn_like(w)
        got = plan(x2, w2)
        assert torch.equal(got, x2 * w2.repeat(16).view(16, 2048))
        assert got.shape == x.shape and got.dtype == x.dtype
    # a pointer Triton assumed 16-byte aligned that is not: this call takes the forward
    base = torch.randn(16 * 2048 + 1, device="cuda", dtype=torch.bfloat16)
    assert plan(base[1:].view(16, 2048), w) is None


@gpu
def test_a_forward_that_returns_its_input_replays_in_place(tmp_path):
    model = _model(tmp_path, "inplace")
    x, w = torch.randn(4, 256, device="cuda"), torch.randn(256, device="cuda")
    plan, why = make_plan(model, [x, w])
    assert plan is not None, why
    want = x * w
    got = plan(x, w)
    assert got is x and torch.equal(x, want)


@gpu
@pytest.mark.parametrize("mode", ["contiguous", "zeros"])
def test_forwards_that_write_memory_outside_kernels_keep_their_forward(tmp_path, mode):
    model = _model(tmp_path, mode)
    x = torch.randn(256, 4, device="cuda").t() if mode == "contiguous" else torch.randn(4, 256, device="cuda")
    plan, why = make_plan(model, [x, torch.randn(256, device="cuda")])
    assert plan is None and "write memory" in why, why


@gpu
def test_no_plan_while_something_hooks_tritons_launches(tmp_path):
    from triton import knobs

    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        plan, why = make_plan(_model(tmp_path), [torch.randn(4, 256, device="cuda"), torch.randn(256, device="cuda")])
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert plan is None and "hooks" in why


@gpu
def test_a_forward_launching_nothing_keeps_its_forward():
    plan, why = make_plan(lambda x: x.view(-1), [torch.randn(4, 4, device="cuda")])
    assert plan is None and "no Triton kernel" in why


SCALARS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(X, Y, n, alpha, flip, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(X + i, mask=m)
    tl.store(Y + i, tl.where(flip, -x, x) * alpha, mask=m)


def forward(x, flip):
    y = torch.empty_like(x)
    _axpy[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), 1.5, flip, BLOCK=256)
    return y
'''


@gpu
def test_a_plan_launches_through_torchs_static_launcher_where_it_takes_the_kernel(tmp_path):
    """The scale kernel (pointers, 32-bit ints, a constexpr) goes to torch's static launcher, which gets its
    runtime arguments only; the replay is the forward's, bit for bit, on inputs it did not record."""
    if not hasattr(torch._C, "_StaticCudaLauncher"):
        pytest.skip("this torch has no static CUDA launcher")
    model = _model(tmp_path)
    x, w = torch.randn(16, 2048, device="cuda"), torch.randn(2048, device="cuda")
    plan, why = make_plan(model, [x, w])
    assert plan is not None, why
    assert plan.static_notes == [""]
    x2, w2 = torch.randn_like(x), torch.randn_like(w)
    assert torch.equal(plan(x2, w2), model(x2, w2))


@gpu
def test_a_kernel_the_static_launcher_would_pass_differently_keeps_tritons(tmp_path):
    """A bool scalar (Triton's i1) is not passed by the static launcher as Triton does: that launch keeps Triton's
    launcher, and the plan still replays the forward."""
    import importlib.util

    path = tmp_path / "k_scalars.py"
    path.write_text(SCALARS)
    spec = importlib.util.spec_from_file_location("k_scalars", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(1000, device="cuda")
    plan, why = make_plan(lambda t: mod.forward(t, True), [x])
    assert plan is not None, why
    assert plan.static_notes and plan.static_notes[0] in ("a scalar type the static launcher passes differently",
                                                          "this torch has no static CUDA launcher")
    assert torch.equal(plan(x), -x * 1.5)
