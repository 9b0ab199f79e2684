"""The reference's float64 rerun (``reference_job._truth``) that fp16 and bf16 outputs are also held to: made where the
model computes the same function in float64, and withheld where it cannot or where eager's outputs differ from it by
more than rounding."""

from __future__ import annotations

import torch
import torch.nn as nn
from safetensors.torch import load_file

from ks_inductor.judge.reference_job import _truth


class _Rotate(nn.Module):
    def forward(self, q, c, s):
        half = q.shape[-1] // 2
        return q * c + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * s


class _Noisy(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


class _TiedToBf16(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.ones(8, 8))

    def forward(self, x):
        return x @ self.w.to(torch.bfloat16)  # a float64 x against a bf16 weight: matmul refuses mixed dtypes


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 8, generator=g).to(dtype) for _ in range(3)]


def _run(model, inputs, tmp_path):
    with torch.no_grad():
        outs = [model(*inputs)]
    return outs, _truth(model, outs, lambda: inputs, str(tmp_path / "truth.safetensors"), {})


def test_a_bf16_model_gets_its_float64_result_kept_in_float32(tmp_path):
    inputs = _inputs()
    outs, path = _run(_Rotate(), inputs, tmp_path)
    assert path is not None
    got = load_file(path)["out0"]
    q, c, s = (t.double() for t in inputs)
    want = q * c + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * s
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, atol=1e-6)
    assert not torch.equal(got, outs[0].float())  # eager's rounding is not the float64 result's


def test_no_float64_result_for_fp32_outputs_randomness_or_a_model_tied_to_its_dtype(tmp_path):
    assert _run(_Rotate(), _inputs(torch.float32), tmp_path)[1] is None
    torch.manual_seed(0)
    assert _run(_Noisy(), _inputs()[:1], tmp_path)[1] is None
    assert _run(_TiedToBf16(), _inputs()[:1], tmp_path)[1] is None
    assert not (tmp_path / "truth.safetensors").exists()
