"""NaN in, NaN out: the judge's "nan" trial, and the kernels it turns away.

torch's relu, clamp, max and amax return NaN where an operand is NaN; Triton's tl.maximum and tl.max default to IEEE
maxNum, which drops it (maxnumf on a GPU, np.fmax in the interpreter alike). A kernel built on the default would hide
a model's NaN from its user, so one trial's inputs carry NaN and the outputs must carry it where torch's do.
"""

from __future__ import annotations

import pytest

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(16, 40)]


def get_init_inputs():
    return []
'''

# One program per row: relu of the row, or its max (NaN-propagating or not, per PROP).
CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _combine(a, b):
    return tl.maximum(a, b{prop})


@triton.jit
def _row(x_ptr, o_ptr, n, BLOCK: tl.constexpr, REDUCE: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < n
    x = tl.load(x_ptr + r * n + c, mask=m, other=-float('inf'))
    if REDUCE:
        tl.store(o_ptr + r, tl.reduce(x, 0, _combine))
    else:
        tl.store(o_ptr + r * n + c, tl.maximum(x, 0.0{prop}), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        reduce = {reduce}
        out = torch.empty((x.shape[0],) if reduce else x.shape, device=x.device, dtype=x.dtype)
        _row[(x.shape[0],)](x, out, x.shape[1], BLOCK=64, REDUCE=reduce)
        return out
'''

PROP = ", propagate_nan=tl.PropagateNan.ALL"


@pytest.fixture(scope="module")
def judge():
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig(backend="triton-interpret", compile_timeout_s=40, run_timeout_s=40, memory_limit_mb=3000)
    with Judge(cfg, spares=False) as j:
        yield j


def _problem(expr: str, name: str):
    from ks_inductor.problem_tracing import problem_from_source

    return problem_from_source(PROBLEM.format(expr=expr), name=name)


@pytest.mark.parametrize("expr,reduce", [("torch.relu(x)", 0), ("x.amax(dim=1)", 1)])
def test_a_kernel_that_drops_nan_is_rejected_on_the_nan_trial(judge, expr, reduce):
    problem = _problem(expr, "relu" if not reduce else "row_max")
    dropping = judge.submit(problem, CANDIDATE.format(prop="", reduce=reduce))
    keeping = judge.submit(problem, CANDIDATE.format(prop=PROP, reduce=reduce))
    bad, good = dropping.result(), keeping.result()
    assert good.accepted, good.feedback_text()
    assert not bad.correct and bad.mismatch is not None, bad.feedback_text()
    assert bad.mismatch.distribution == "nan", bad.mismatch
    assert bad.mismatch.nan_dropped >= 1 and bad.mismatch.nan_added == 0, bad.mismatch
    # The feedback names the cause and the fix, for the LLM that makes the next change.
    text = bad.feedback_text()
    assert "'nan'" in text and f"NaN at {bad.mismatch.nan_dropped} elements" in text
    assert "propagate_nan=tl.PropagateNan.ALL" in text


def test_nan_inputs_are_sparse_reproducible_and_follow_the_strides():
    import types

    import torch

    from ks_inductor.judge.inputs import NAN_EVERY, make_inputs

    mod = types.SimpleNamespace(get_inputs=lambda: [torch.randn(3, 4)])
    specs = [{"kind": "tensor", "dtype": "bfloat16", "shape": [300, 500], "stride": [1, 300]}]
    x = make_inputs(mod, specs, 7, "nan", "cpu")[0]
    again = make_inputs(mod, specs, 7, "nan", "cpu")[0]
    assert x.stride() == (1, 300) and x.dtype == torch.bfloat16
    n_nan = int(torch.isnan(x).sum())
    assert 1 <= n_nan <= 1 + x.numel() // NAN_EVERY
    assert torch.equal(torch.isnan(x), torch.isnan(again))
    finite = x[~torch.isnan(x)].float()
    assert finite.min() >= -1.0 and finite.max() <= 1.0
    for dist in ("native", "normal", "large", "normal_shifted"):
        specs1 = [{"kind": "tensor", "dtype": "float32", "shape": [40, 40], "stride": [40, 1]}]
        assert not torch.isnan(make_inputs(mod, specs1, 7, dist, "cpu")[0]).any(), dist


def test_a_problem_that_refuses_nan_is_judged_on_its_own_inputs_there(judge):
    """A reference that raises on NaN (a sampler checking its probabilities) gets its native inputs on that trial
    instead of failing the whole judgment."""
    # Cholesky raises on a NaN matrix; times zero it leaves the output relu's.
    gram = "x @ x.T + 300.0 * torch.eye(16, device=x.device)"
    problem = _problem(f"torch.relu(x) + 0.0 * torch.linalg.cholesky({gram}).sum()", "relu_refuses_nan")
    r = judge.evaluate(problem, CANDIDATE.format(prop=PROP, reduce=0))
    assert r.accepted, r.feedback_text()


def test_integer_bf16_rounding_keeps_nan_payloads(tmp_path):
    """The integer round-to-nearest-even adds 0x7FFF (+1) to the bits. The GPU's canonical NaN, 0x7FFFFFFF, carried
    into the sign bit and came out -0.0: a NaN in RoPE's q gave a finite attention row on the H200. The interpreter's
    own NaN (0x7FC00000) never showed it, so the payloads are fed in as bits."""
    import importlib.util

    import torch

    from ks_inductor.seeds.pointwise import RNE_BF16_HELPER

    path = tmp_path / "rne_probe.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + RNE_BF16_HELPER + '''

@triton.jit
def _probe(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, _rne_bf16(tl.load(x_ptr + i, mask=m)), mask=m)
''')
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bits = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7FBFFFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x3F808000,
            0x3F818000, 0x00000001]
    x = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)
    out = torch.empty_like(x)
    mod._probe[(1,)](x, out, x.numel(), BLOCK=16)
    want = x.to(torch.bfloat16).float()
    assert torch.equal(torch.isnan(out), torch.isnan(x)), out
    finite = ~torch.isnan(x)
    assert torch.equal(out[finite], want[finite]), (out, want)


@pytest.mark.parametrize("name,template,params", [
    ("softmax_bf16", "softmax_online", {"CHUNK_MAX": 0}),
    ("cross_entropy_fp32", "cross_entropy", {}),
])
def test_online_per_lane_maxima_keep_a_lane_that_saw_only_nan(tmp_path, name, template, params):
    """A row shorter than BLOCK gives each lane one logit. The fold at the end drops lanes whose running max is
    -inf; with maxNum a NaN lane's max stayed -inf, so its NaN sum was dropped and the row came out finite."""
    import importlib.util

    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.catalogue.sources import small_problem
    from ks_inductor.seeds.families import classify, template_named

    problem = small_problem(name)
    fm = classify(problem)
    fm.target = "cpu"
    t = template_named(template)
    pm = exec_problem_source(problem.source)
    xs = pm.get_inputs()
    xs[0] = xs[0].clone()
    xs[0][1, 3] = float("nan")
    want = pm.Model(*pm.get_init_inputs())(*xs)
    for variant in [v for v in t.variants(fm) if v.startswith("online")]:
        p = {**t.default(fm, variant, "cpu"), **params}
        assert p.get("BLOCK", 0) > xs[0].shape[1]
        path = tmp_path / f"{name}_{variant}.py"
        path.write_text(t.render(fm, p, variant))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        got = mod.ModelNew(*pm.get_init_inputs())(*xs)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (variant, int(torch.isnan(got).sum()))
