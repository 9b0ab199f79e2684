"""Every seed template's kernels compile for an H200 (sm_90) with the real Triton compiler, on a CPU-only box.

The interpreter accepts things PTX generation does not (and the other way round), and CI has no GPU. So the
candidate module is imported without TRITON_INTERPRET, its forward runs on meta tensors with kernel launches
intercepted, and each launch's specialization is compiled ahead of time for sm_90 down to a cubin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ks_inductor.catalogue import PROBLEM_DIR

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = sorted(PROBLEM_DIR.glob("*.py"))

def _compile_all(problem_path: str, which: str) -> list[dict]:
    """Runs in a child process without TRITON_INTERPRET."""
    import importlib.util
    import shutil
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    sys.path.insert(0, str(ROOT))
    from benchmarks.sass_counts import launch_signature
    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import classify, templates_for

    problem = load_problem(problem_path)
    fm = classify(problem)
    assert fm is not None, f"no family for {problem_path}"
    fm.target = "cuda"
    launches: list[tuple] = []
    original = JITFunction.run

    def capture(self, *args, grid=None, warmup=False, **kwargs):  # noqa: ANN001
        launches.append((self, args, kwargs))

    JITFunction.run = capture
    report = []
    tmp = tempfile.mkdtemp(prefix="ks-cc-")
    try:
        pm = exec_problem_source(problem.source)
        for t in templates_for(fm):
            variants = t.variants(fm) if which == "all" else t.variants(fm)[:1]
            renders = []
            for v in variants:
                d = t.default(fm, v, "cuda")
                renders.append((v, d))
                for e in t.space(fm, v).get("EVICT", [])[1:]:  # each cache hint is a code path of its own
                    renders.append((v, {**d, "EVICT": e}))
                if "WS" in d:  # and the K loop with and without warp specialization (which needs it nested)
                    renders.append((v, {**d, "WS": 1 - d["WS"], "FLAT": 0}))
                if "LATEVEC" in d:  # and broadcast vectors loaded first or after the reductions
                    renders.append((v, {**d, "LATEVEC": 1 - d["LATEVEC"]}))
                if "VEVICT" in d:  # and broadcast vectors with or without the keep-in-cache hint
                    renders.append((v, {**d, "VEVICT": 1 - d["VEVICT"]}))
                if "VFIRST" in d:  # and broadcast vector loads pinned ahead of the rows by a barrier, or not
                    renders.append((v, {**d, "VFIRST": 1 - d["VFIRST"]}))
                if "FLAT" in d:  # and the tile loop flattened into the K loop or not
                    renders.append((v, {**d, "FLAT": 1 - d["FLAT"]}))
                if "FASTEXP" in d:  # and the flushing exp2 helper (inline PTX)
                    renders.append((v, {**d, "FASTEXP": 1 - d["FASTEXP"]}))
                if "RND" in d:  # so is each way of rounding intermediates
                    renders.append((v, {**d, "RND": 1 - d["RND"]}))
                if "NATIVE" in d:  # and 16-bit arithmetic against fp32 with emulated roundings
                    renders.append((v, {**d, "NATIVE": 1 - d["NATIVE"]}))
            for n_r, (v, params) in enumerate(renders):
                src = t.render(fm, params, v)
                # Triton reads kernel source back from a file (inspect), so the module must live in one.
                path = os.path.join(tmp, f"cand_{t.name}_{v}_{n_r}.py")
                with open(path, "w") as fh:
                    fh.write(src)
                spec = importlib.util.spec_from_file_location(f"ks_cand_{t.name}_{v}_{n_r}", path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = mod
                spec.loader.exec_module(mod)
                with torch.device("meta"):
                    model = mod.ModelNew(*pm.get_init_inputs())
                inputs = []
                for s in problem.input_specs:
                    if s.kind == "tensor":
                        inputs.append(torch.empty_strided(s.shape, s.stride, dtype=getattr(torch, s.dtype),
                                                          device="meta"))
                    else:
                        inputs.append(s.value)
                launches.clear()
                with torch.no_grad():
                    model(*inputs)
                assert launches, f"{t.name}/{v} launched nothing"
                for fn, args, kwargs in launches:
                    # The launch's own specializations (16-byte alignment, multiples of 16), as the GPU would see.
                    sig, consts, attrs, opts = launch_signature(fn, args, kwargs)
                    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                                        target=GPUTarget("cuda", 90, 32), options=opts)
                    report.append({"template": t.name, "variant": v, "kernel": fn.__name__,
                                   "cubin": len(ck.asm.get("cubin", b"")), "regs": getattr(ck, "n_regs", None),
                                   "spills": getattr(ck, "n_spills", None), "rnd": params.get("RND"),
                                   "native": params.get("NATIVE"), "flat": params.get("FLAT"),
                                   "bf16_math": bool(re.search(r"\bmul(\.rn)?\.bf16", ck.asm.get("ptx", ""))),
                                   "bf16_fma": "fma.rn.bf16" in ck.asm.get("ptx", "")})
    finally:
        JITFunction.run = original
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _extra_problems(tmp_path: Path, names: list[str] | tuple[str, ...]) -> list[Path]:
    """The catalogue's problems ``names`` (``FAMILY_PROBLEMS``), written as problem files."""
    from ks_inductor.catalogue.families import FAMILY_PROBLEMS

    paths = [tmp_path / f"{name}.py" for name in names]
    for name, path in zip(names, paths):
        path.write_text(FAMILY_PROBLEMS[name][0])
    return paths


def _run(problems: list[Path], which: str = "first") -> dict[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = subprocess.run([sys.executable, __file__, which, *map(str, problems)], capture_output=True, text=True,
                         env=env, timeout=900, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_template_kernels_compile_for_sm90() -> None:
    pytest.importorskip("triton.backends.nvidia")
    report = _run(PROBLEMS)
    assert set(report) == {p.stem for p in PROBLEMS}
    for name, kernels in report.items():
        assert kernels and all(k["cubin"] > 0 for k in kernels), (name, kernels)
    # Both ways of rounding bf16 intermediates were compiled; neither lets the compiler fuse a rounded product
    # into an add (RoPE's `q * cos + rotate_half(q) * sin` is where that happened).
    assert {k["rnd"] for k in report["rope_bf16"]} == {0, 1}
    assert not [k for ks in report.values() for k in ks if k["bf16_fma"]]
    # NATIVE RoPE computes with bf16 instructions (the fp32 form never does), still without a fused product.
    assert {(k["native"], k["bf16_math"]) for k in report["rope_bf16"]} == {(0, False), (1, True)}
    # RMSNorm's rounded values only feed products and the store, so they go unfenced and the compiler narrows
    # `rounded * weight` to a bf16 multiply: with the hardware rounding only.
    assert {(k["rnd"], k["bf16_math"]) for k in report["rmsnorm_bf16"] if k["template"] == "rowwise"} == {
        (0, False), (1, True)}


HAZARD = """import torch
import torch.nn as nn

from ks_inductor.catalogue import PROBLEM_DIR


class Model(nn.Module):
    def forward(self, a, b, c, d):
        p = (a.float() * b.float()).to(torch.bfloat16)  # rounded product into an add: must stay fenced
        q = (p.float() * d.float()).to(torch.bfloat16)  # rounded product into a product: may go unfenced
        return (p.float() + c.float()).to(torch.bfloat16) * q


def get_inputs():
    return [torch.randn(1024, 1024, dtype=torch.bfloat16) for _ in range(4)]


def get_init_inputs():
    return []
"""


def test_unfenced_roundings_never_let_a_product_fuse_into_an_add(tmp_path) -> None:
    pytest.importorskip("triton.backends.nvidia")
    path = tmp_path / "round_hazard.py"
    path.write_text(HAZARD)
    (kernels,) = _run([path], "all").values()
    assert {k["rnd"] for k in kernels} == {0, 1} and all(k["cubin"] > 0 for k in kernels)
    assert not [k for k in kernels if k["bf16_fma"]], kernels
    assert any(k["bf16_math"] for k in kernels if k["rnd"] == 1), kernels


def test_decode_matmul_variants_compile_for_sm90(tmp_path) -> None:
    """The skinny (decode) GEMM in every variant, split-K's two kernels and the tensor-descriptor (TMA) kernel,
    warp-specialized or not and flattened or not, included."""
    pytest.importorskip("triton.backends.nvidia")
    from benchmarks.workloads import llm_ops_workloads

    (w,) = llm_ops_workloads(["gemm_gelu"], ["bfloat16"], ["decode"])
    path = tmp_path / "gemm_gelu_decode.py"
    path.write_text(w.source)
    (kernels,) = _run([path], "all").values()
    assert {k["variant"] for k in kernels} == {"tiled", "persistent", "tma", "splitk"}
    assert {"_matmul_partial", "_matmul_epilogue"} <= {k["kernel"] for k in kernels}
    assert {k["flat"] for k in kernels if k["variant"] == "tma"} == {0, 1}
    assert all(k["cubin"] > 0 for k in kernels), kernels


def test_decode_attention_variants_compile_for_sm90(tmp_path) -> None:
    """The decoder layer's decode attention (bf16, 32 heads over 8 KV heads, 2048 cached, RoPE and cache
    concatenation fused) in every variant, without register spills at the default launch parameters."""
    pytest.importorskip("triton.backends.nvidia")
    from ks_inductor.catalogue.attention import DECODE

    path = tmp_path / "decode_attention.py"
    path.write_text(DECODE.format(B=16, T=1, P=2048, NH=32, KV=8, D=128, dtype="bfloat16", extra=""))
    (kernels,) = _run([path], "all").values()
    assert {k["variant"] for k in kernels} == {"split", "direct"}
    assert {"_attn_fwd", "_attn_combine"} <= {k["kernel"] for k in kernels}
    assert all(k["cubin"] > 0 and not k["spills"] for k in kernels), kernels



def test_family_test_problems_compile_for_sm90(tmp_path) -> None:
    """Every variant for the family contract's problems (``CONTRACT_PROBLEMS``, ``tests/test_family_contract.py``)."""
    pytest.importorskip("triton.backends.nvidia")
    from ks_inductor.catalogue.families import CONTRACT_PROBLEMS

    names = sorted(n for n, (_, family) in CONTRACT_PROBLEMS.items() if family is not None)
    paths = [tmp_path / f"{n}.py" for n in names]
    for n, path in zip(names, paths):
        path.write_text(CONTRACT_PROBLEMS[n][0])
    report = _run(paths, "all")
    assert set(report) == set(names)
    for name, kernels in report.items():
        assert kernels and all(k["cubin"] > 0 for k in kernels), (name, kernels)

if __name__ == "__main__":
    # One process for every problem: importing torch and triton once keeps this test short.
    mode = sys.argv[1]
    print(json.dumps({Path(p).stem: _compile_all(p, mode) for p in sys.argv[2:]}))


def test_whole_tensor_reduction_variants_compile_for_sm90(tmp_path) -> None:
    """The losses and x / ||x||, in both block orders: partial sums, finish and apply kernels, the NaN constant of
    the KL divergence, and the bf16 norm with either rounding."""
    pytest.importorskip("triton.backends.nvidia")
    paths = _extra_problems(tmp_path, ("mse_loss", "kl_div_batchmean", "hinge_broadcast", "frobenius_normalize",
                                       "l1_norm_bf16_keepdim"))
    report = _run(paths, "all")
    for name, kernels in report.items():
        assert {k["variant"] for k in kernels} == {"strided", "chunked"}, name
        assert all(k["cubin"] > 0 and not k["spills"] for k in kernels), (name, kernels)
    assert {k["kernel"] for k in report["frobenius_normalize"]} == {"_total_partials", "_total_finish", "_total_apply"}
    assert {k["kernel"] for k in report["mse_loss"]} == {"_total_partials", "_total_finish"}
    assert {k["rnd"] for k in report["l1_norm_bf16_keepdim"]} == {0, 1}


def test_scan_variants_compile_for_sm90(tmp_path) -> None:
    """Cumulative sums and products: forwards, backwards, exclusive, over a strided dim, and in bf16 with either
    rounding."""
    pytest.importorskip("triton.backends.nvidia")
    paths = _extra_problems(tmp_path, ("cumsum_rows", "cumprod_rows", "cumsum_reverse", "cumsum_exclusive",
                                       "masked_cumsum_middle_dim", "cumsum_bf16_minus_input"))
    report = _run(paths, "all")
    assert all(k["cubin"] > 0 and not k["spills"] for ks in report.values() for k in ks), report
    assert {k["variant"] for k in report["masked_cumsum_middle_dim"]} == {"col"}
    assert {k["variant"] for k in report["cumsum_reverse"]} == {"row"}
    assert {k["rnd"] for k in report["cumsum_bf16_minus_input"]} == {0, 1}


def test_pool_kernels_compile_for_sm90(tmp_path) -> None:
    """Max and average pools over 2 and 3 dims, with dilation, uncounted padding, a divisor override and bf16."""
    pytest.importorskip("triton.backends.nvidia")
    names = ("max_pool1d_dilated", "max_pool2d_ceil", "max_pool3d_bf16", "avg_pool2d_ceil_uncounted_pad",
             "avg_pool3d_divisor")
    report = _run(_extra_problems(tmp_path, names), "all")
    assert set(report) == set(names)
    assert all(k["cubin"] > 0 and not k["spills"] for ks in report.values() for k in ks), report


def test_pool_and_group_norm_kernels_compile_for_sm90(tmp_path) -> None:
    """The pool template's flat and window variants (2-d at stride 1, 3-d, a 1-d pool as 2-d) and the group-norm
    family's two kernels (group norm per channel, layer norm per element, instance norm, batch norm with running
    statistics), without spills."""
    pytest.importorskip("triton.backends.nvidia")
    names = ["max_pool2d_stride1", "avg_pool3d_overlap", "max_pool1d_dilated", "group_norm_affine", "layer_norm_3d",
             "instance_norm", "batch_norm_2d"]
    report = _run(_extra_problems(tmp_path, names), "all")
    for n in names[:3]:
        assert {k["variant"] for k in report[n]} == {"flat", "window"}, report[n]
    for n in names[3:]:
        assert {k["kernel"] for k in report[n]} == {"_group_stats", "_group_apply", "_group_final"}, report[n]
    assert all(k["cubin"] > 0 and not k["spills"] for ks in report.values() for k in ks), report
