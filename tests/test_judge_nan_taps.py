"""NaN that a padding tap carries: eager's convolution (oneDNN, cuDNN) skips the taps that fall on padding, so a NaN
weight never meets a padding zero, while a kernel that multiplies every tap gets 0 * NaN = NaN there. The judge
accepts that NaN where a plain float64 evaluation of the model has it too, and still refuses a kernel that turns NaN
into a number or adds NaN that no NaN input reaches."""

from __future__ import annotations

import pytest

# A 2x2 kernel with padding 1: every tap falls on padding for some output row or column, so wherever the NaN-input
# trial puts the weight's NaN, eager skips it at some output that a tap-by-tap kernel makes NaN.
PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, w):
        return F.conv2d(x, w, padding=1)


def get_inputs():
    return [torch.randn(2, 4, 8, 8), torch.randn(4, 4, 2, 2)]


def get_init_inputs():
    return []
'''

# One program per (image, output channel); every tap multiplies the input loaded with other=0.0 outside the image.
CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _conv(x_ptr, w_ptr, o_ptr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr,
          OH: tl.constexpr, OW: tl.constexpr, BLOCK: tl.constexpr, ZERO_NAN: tl.constexpr):
    n = tl.program_id(0)
    co = tl.program_id(1)
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for ci in range(C):
        for kh in range(K):
            for kw in range(K):
                ih = rows + kh - 1
                iw = cols + kw - 1
                inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                x = tl.load(x_ptr + ((n * C + ci) * H + ih) * W + iw, mask=inside, other=0.0)
                wt = tl.load(w_ptr + ((co * C + ci) * K + kh) * K + kw)
                acc += x * wt
    if ZERO_NAN:
        acc = tl.where(acc != acc, 0.0, acc)
    out = (rows < OH) & (cols < OW)
    tl.store(o_ptr + ((n * C + co) * OH + rows) * OW + cols, acc, mask=out)


class ModelNew(nn.Module):
    def forward(self, x, w):
        n, c, h, wd = x.shape
        k = w.shape[-1]
        oh, ow = h + 3 - k, wd + 3 - k
        out = torch.empty((n, w.shape[0], oh, ow), device=x.device, dtype=x.dtype)
        _conv[(n, w.shape[0])](x, w, out, C=c, H=h, W=wd, K=k, OH=oh, OW=ow, BLOCK=16, ZERO_NAN={zero_nan})
        return out
'''


@pytest.fixture(scope="module")
def judge():
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig(backend="triton-interpret", compile_timeout_s=60, run_timeout_s=60, memory_limit_mb=3000)
    with Judge(cfg, spares=False) as j:
        yield j


def test_eager_skips_the_padding_taps_that_a_float64_rerun_multiplies(tmp_path):
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge.reference_job import _truth

    mod = exec_problem_source(PROBLEM, "<problem>")
    model = mod.Model()
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 2, 2)
    w[1, 2, 0, 0] = float("nan")
    eager = model(x, w)
    path = _truth(model, [eager], lambda: [x, w], str(tmp_path / "t.safetensors"), {}, nan_inputs=True)
    assert path is not None
    from safetensors.torch import load_file

    rerun = load_file(path)["out0"]
    # The premise of the rule: eager has numbers where the rerun has NaN (the row and column a padding tap covers),
    # and never NaN where the rerun has a number.
    assert int(torch.isnan(rerun).sum()) > int(torch.isnan(eager).sum())
    assert not bool((torch.isnan(eager) & ~torch.isnan(rerun)).any())
    # Without NaN inputs a float32 output gets no rerun.
    assert _truth(model, [eager], lambda: [x, w], str(tmp_path / "u.safetensors"), {}) is None


def test_compare_accepts_nan_only_where_the_rerun_has_it():
    import torch

    from ks_inductor.judge.compare import compare_outputs

    def tol(_: str) -> tuple[float, float]:
        return 1e-4, 1e-4

    ref = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    rerun = torch.tensor([1.0, float("nan"), float("nan"), 4.0])
    padded = torch.tensor([1.0, float("nan"), float("nan"), 4.0])
    assert compare_outputs([ref], [padded], tol, 0, "nan", truth=[rerun]) == (None, None)
    # The same output without the rerun: a NaN where eager has a number.
    m, why = compare_outputs([ref], [padded], tol, 0, "nan")
    assert why and m is not None and m.nan_added == 1
    # NaN where the rerun has a number, NaN turned into a number, and a wrong finite value are refused.
    for out, field in ((torch.tensor([1.0, 2.0, float("nan"), float("nan")]), "nan_added"),
                       (torch.tensor([1.0, 2.0, 0.0, 4.0]), "nan_dropped"),
                       (torch.tensor([1.0, float("nan"), float("nan"), 5.0]), None)):
        m, why = compare_outputs([ref], [out], tol, 0, "nan", truth=[rerun])
        assert why and m is not None, out
        if field:
            assert getattr(m, field) == 1, (out, m)


def test_a_kernel_that_multiplies_every_tap_is_accepted_and_one_that_zeroes_nan_is_not(judge):
    from ks_inductor.problem_tracing import problem_from_source

    problem = problem_from_source(PROBLEM, name="conv_pad_taps")
    tap_by_tap = judge.submit(problem, CANDIDATE.replace("{zero_nan}", "0"))
    zeroing = judge.submit(problem, CANDIDATE.replace("{zero_nan}", "1"))
    good, bad = tap_by_tap.result(), zeroing.result()
    assert good.correct, good.feedback_text()
    assert not bad.correct and bad.mismatch is not None, bad.feedback_text()
    assert bad.mismatch.nan_dropped >= 1, bad.mismatch


ATTENTION = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)]


def get_init_inputs():
    return []
'''


def test_attention_over_one_key_gives_a_number_in_eager_where_the_rerun_scores_nan(tmp_path):
    """A decode step's first key: the fused attention returns a value for a NaN score, the math of softmax (and a
    kernel that scores every key) gives NaN, which the float64 rerun, by attention's math backend, has too."""
    import torch
    from safetensors.torch import load_file

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge.reference_job import _truth

    model = exec_problem_source(ATTENTION, "<problem>").Model()
    q, k, v = (torch.randn(1, 2, 1, 8) for _ in range(3))
    k[0, 1, 0, 3] = float("nan")
    eager = model(q, k, v)
    assert not bool(torch.isnan(eager).any())  # the premise: eager has numbers for the head whose score is NaN
    rerun = load_file(_truth(model, [eager], lambda: [q, k, v], str(tmp_path / "t.safetensors"), {},
                             nan_inputs=True))["out0"]
    assert bool(torch.isnan(rerun[0, 1]).all()) and not bool(torch.isnan(rerun[0, 0]).any())
