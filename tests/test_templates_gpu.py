"""Template renders that only a GPU can check: 16-bit arithmetic (the interpreter has none of its own).

    KS_TEST_GPU=1 pytest -m gpu tests/test_templates_gpu.py
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from ks_inductor.catalogue import PROBLEM_DIR

pytestmark = pytest.mark.gpu

ROPE = (PROBLEM_DIR / "rope_bf16.py").read_text()


def _rope_source(dtype: str, heads: tuple[int, int], seq: int) -> str:
    src = ROPE.replace("torch.bfloat16", f"torch.{dtype}")
    return (src.replace("q_heads = 32", f"q_heads = {heads[0]}").replace("k_heads = 8", f"k_heads = {heads[1]}")
            .replace("seq_len = 4096", f"seq_len = {seq}"))


@pytest.mark.parametrize("dtype,heads,seq,params", [
    ("bfloat16", (32, 8), 4096, {}),
    ("bfloat16", (6, 3), 77, {"HB": 4, "BLOCK_T": 16}),  # ragged heads and positions: the masked path
    ("bfloat16", (8, 2), 256, {"HTILE": 1}),
    ("float16", (8, 2), 256, {}),
])
def test_native_rope_rounds_like_eager(tmp_path, dtype, heads, seq, params):
    """NATIVE computes in the 16-bit dtype with FP fusion off: each op is rounded once, as eager rounds it, so
    the output is bit for bit eager's. A contracted product (one rounding skipped) breaks this on real data."""
    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import problem_from_source
    from ks_inductor.seeds.families import classify, template_named

    src = _rope_source(dtype, heads, seq)
    fm = classify(problem_from_source(src, name="rope"))
    fm.target = "cuda"
    t = template_named("rope")
    p = {**t.default(fm, "fused", "cuda"), **params}
    assert p["NATIVE"] == 1
    path = tmp_path / f"rope_native_{dtype}_{seq}.py"
    path.write_text(t.render(fm, p, "fused"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    pm = exec_problem_source(src)
    torch.manual_seed(0)
    inputs = [x.cuda() for x in pm.get_inputs()]
    # Cancellation-prone values: q * cos and rotate_half(q) * sin of nearly equal size and opposite sign.
    inputs[0] = inputs[0] * 3.0
    want = pm.Model()(*inputs)
    got = mod.ModelNew()(*inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g.float() - w.float()).abs().max().item()
