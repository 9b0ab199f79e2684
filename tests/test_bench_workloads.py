"""The llm-ops workloads, the roofline floor and the fast_p arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.fastp import fast_p, geomean, summarize_speedups
from benchmarks.roofline import Ceilings, floor_ms
from benchmarks.workloads import FULL, OPS, llm_ops_workloads
from ks_inductor.catalogue import PROBLEM_DIR

ROOT = Path(__file__).resolve().parent.parent


def test_suite_composition():
    ws = llm_ops_workloads()
    names = [w.name for w in ws]
    assert len(names) == len(set(names)) == 6 * 2 * 2 + 2
    assert {w.op for w in ws} == set(OPS)
    ce = [w for w in ws if w.op == "cross_entropy"]
    assert {w.dtype for w in ce} == {"float32"} and {w.phase for w in ce} == {"prefill", "decode"}
    assert {w.dtype for w in ws if w.op != "cross_entropy"} == {"bfloat16", "float16"}
    with pytest.raises(ValueError, match="unknown phase"):
        llm_ops_workloads(phases=["training"])


# The bf16 prefill workloads must be the very problems of the catalogue's files (same canonical key), so the kernels
# evolved for those files are the ones the benchmark finds in the cache.
_PROBLEM_FILES = {"rmsnorm": "rmsnorm_bf16.py", "layernorm": "layernorm_bf16.py", "softmax": "softmax_bf16.py",
                  "silu_mul": "silu_mul_bf16.py", "rope": "rope_bf16.py", "cross_entropy": "cross_entropy_fp32.py",
                  "gemm_gelu": "gemm_gelu_bf16.py"}


@pytest.mark.parametrize("op", sorted(_PROBLEM_FILES))
def test_bf16_prefill_workload_shares_the_problem_files_key(op):
    from ks_inductor.problem_tracing import load_problem

    path = PROBLEM_DIR / _PROBLEM_FILES[op]
    if not path.exists():
        pytest.skip(f"{path} not written yet")
    dtypes = ["float32"] if op == "cross_entropy" else ["bfloat16"]
    (w,) = llm_ops_workloads([op], dtypes, ["prefill"], FULL)
    assert w.problem().key == load_problem(path).key


def test_decode_and_prefill_are_distinct_problems():
    ws = llm_ops_workloads(["rope"], ["float16"])
    keys = {w.problem().key for w in ws}
    assert len(keys) == 2
    decode = next(w for w in ws if w.phase == "decode").problem()
    assert decode.input_specs[0].shape == [16, 32, 1, 128]
    assert decode.input_specs[2].shape == [16, 1, 128]


def test_floor_memory_and_compute_bound():
    c = Ceilings(copy_bytes_per_s=4e12, matmul_flops_per_s={"bfloat16": 700e12})
    ms, bound = floor_ms(64 * 2**20, 10**9, {"add": 1, "mul": 2}, "bfloat16", c)
    assert bound == "memory" and ms == pytest.approx(64 * 2**20 / 4e12 * 1e3)  # pointwise FLOPs never bound
    flops = 2 * 4096 * 4096 * 14336
    ms, bound = floor_ms(150 * 2**20, flops, {"mm": 1, "gelu": 1}, "bfloat16", c)
    assert bound == "compute" and ms == pytest.approx(flops / 700e12 * 1e3)
    ms, bound = floor_ms(150 * 2**20, flops, {"mm": 1}, "float16", c)  # no fp16 peak measured: memory only
    assert bound == "memory"
    assert floor_ms(100, 100, {"mm": 1}, "bfloat16", Ceilings()) == (None, None)


def test_workload_floor_uses_problem_bytes():
    (w,) = llm_ops_workloads(["rmsnorm"], ["bfloat16"], ["prefill"], FULL)
    p = w.problem()
    # x in, y out (bf16 4096 x 4096 each) and the weight.
    assert p.bytes_moved == 2 * 4096 * 4096 * 2 + 4096 * 2
    ms, bound = floor_ms(p.bytes_moved, p.flops, p.op_summary, "bfloat16", Ceilings(copy_bytes_per_s=4.227e12))
    assert bound == "memory" and ms == pytest.approx(0.0159, rel=0.01)  # the anchors' 15.9 µs


def test_fast_p_counts_missing_kernels_as_failures():
    speedups = [2.5, 1.2, 1.0, None, 0.8]
    assert fast_p(speedups, 1.0) == pytest.approx(2 / 5)  # strictly faster, n = all problems
    assert fast_p(speedups, 2.0) == pytest.approx(1 / 5)
    assert fast_p([], 1.0) == 0.0
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    s = summarize_speedups(speedups)
    assert s["n"] == 5 and s["correct"] == 4
    assert set(s["fast_p"]) == {"1", "1.05", "1.5", "2"}
    assert s["geomean_speedup"] == pytest.approx(math.exp((math.log(2.5) + math.log(1.2) + math.log(0.8)) / 4))
