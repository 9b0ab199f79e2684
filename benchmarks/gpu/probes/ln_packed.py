"""Probe (measurement only, never cached or served): LayerNorm with its rows, weight and bias held as packed bf16
pairs (32-bit words) and widened at each use, so that fewer registers are live through the two reductions.

Session 18's vector probe (vector-traffic-probe-*.json) found LayerNorm's per-call gap to a copy is its first
broadcast vector, not the second nor the vectors being cold: with a vector the 2-row 4-warp kernel takes 112-127
registers (4 programs per SM), without one 90 (5 programs), and only then does it run level with the copy. Widening
each word again at each use, with a shift the compiler cannot prove equal to the last one, takes the kernel to 95
registers at 2 rows and 4 warps and 76 at 4 rows and 8 warps (sm_90, offline).

On the H200 (triton 3.6: 96 and 85 registers; benchmarks/results/ln-packed-probe-*-session18-p{1,2}.json) the 2-row
4-warp form ran 0.03-0.23 us per call behind the template's winner at 127 registers, 4 rows over 8 warps (2 programs
per SM) 3 us behind, and without the barrier that pins the vector loads first 1.1-1.3 us behind. Not kept.

    python benchmarks/gpu/probes/ln_packed.py TAG   # writes $OUT/ln-packed-probe-TAG.json
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import (  # noqa: E402
    configured_model,
    kernel_facts,
    print_ranking,
    probe_data,
    timed_against_floor,
)

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096
WINNER = {"ROWS": 2, "num_warps": 4, "EVICT": 0, "LOWP": 0, "VEVICT": 0, "VFIRST": 1, "RND": 1}


@triton.jit
def _lo(w, z):
    return (w << (16 + z)).to(tl.float32, bitcast=True)


@triton.jit
def _hi(w, z):
    return (w & (-65536 | z)).to(tl.float32, bitcast=True)


@triton.jit
def ln_words(W, B, X, Y, n_cols, ROWS: tl.constexpr, HALF: tl.constexpr, OPAQUE: tl.constexpr,
             PIN: tl.constexpr, XEF: tl.constexpr):
    c = tl.arange(0, HALF)
    if OPAQUE:  # zeros the compiler cannot see, one per use
        z1 = n_cols >> 24
        z2 = n_cols >> 25
        z3 = n_cols >> 26
    else:
        z1 = 0
        z2 = 0
        z3 = 0
    w = tl.load(W.to(tl.pointer_type(tl.int32)) + c)[None, :]
    b = tl.load(B.to(tl.pointer_type(tl.int32)) + c)[None, :]
    if PIN:
        tl.debug_barrier()
    r64 = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    xpol: tl.constexpr = "evict_first" if XEF else ""
    x = tl.load(X.to(tl.pointer_type(tl.int32)) + r64 * HALF + c[None, :], eviction_policy=xpol)
    m = tl.sum(_lo(x, z1) + _hi(x, z1), axis=1)[:, None] / n_cols
    dl = _lo(x, z2) - m
    dh = _hi(x, z2) - m
    r = tl.rsqrt(tl.sum(dl * dl + dh * dh, axis=1)[:, None] / n_cols + 1e-05)
    yl = (_lo(x, z3) - m) * r * _lo(w, z3) + _lo(b, z3)
    yh = (_hi(x, z3) - m) * r * _hi(w, z3) + _hi(b, z3)
    lo = yl.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 65535
    hi = yh.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) << 16
    tl.store(Y.to(tl.pointer_type(tl.int32)) + r64 * HALF + c[None, :], lo | hi)


CONFIGS = [  # rows, warps, opaque, pin, evict_first on rows
    (2, 4, 1, 1, 0), (2, 4, 1, 0, 0), (2, 4, 0, 1, 0), (2, 4, 1, 1, 1),
    (4, 8, 1, 1, 0), (4, 8, 1, 0, 0), (1, 4, 1, 1, 0), (1, 2, 1, 1, 0), (2, 8, 1, 1, 0), (4, 4, 1, 1, 0),
]


def main() -> None:
    tag = sys.argv[1]
    _, xs, ys, w, b = probe_data()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "tag": tag, "errors": {}, "kernels": {}}
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    with torch.no_grad():
        ref_w, model = configured_model("layernorm", WINNER)
        w.copy_(model.weight)
        b.copy_(model.bias)
        tools["template_R2w4_pinned"] = [(lambda a=a, m=model: m(a)) for a in xs]
        for rows, warps, opq, pin, xef in CONFIGS:
            tools[f"words_R{rows}w{warps}_opaque{opq}_pin{pin}_ef{xef}"] = [
                (lambda a=a, o=o, r=rows, wa=warps, opq=opq, pin=pin, xef=xef: ln_words[(M // r,)](
                    w, b, a, o, N, ROWS=r, HALF=N // 2, OPAQUE=opq, PIN=pin, XEF=xef, num_warps=wa, num_stages=1))
                for a, o in zip(xs, ys)]
        ref = F.layer_norm(xs[0].float(), (N,), w.float(), b.float(), 1e-5)
        for name, calls in tools.items():
            if name == "torch_copy":
                continue
            ys[0].fill_(float("nan"))
            got = calls[0]()
            torch.cuda.synchronize()
            out = got if isinstance(got, torch.Tensor) else ys[0]
            res["errors"][name] = (out.float() - ref).abs().max().item()
            facts = kernel_facts(got)
            if facts:
                res["kernels"][name] = facts
        t0 = time.time()
        res.update(timed_against_floor(tools))
        res["wall_s"] = time.time() - t0
    Path(OUT, f"ln-packed-probe-{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"[{tag}] floor {res['floor_ms'] * 1e3:.2f} us; errors {res['errors']}")
    print(f"[{tag}] kernels {res['kernels']}")
    print_ranking(res, res["floor_ms"])


if __name__ == "__main__":
    main()
