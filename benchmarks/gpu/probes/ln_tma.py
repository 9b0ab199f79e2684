"""Probe (not a template, never cached or served): does reading and writing LayerNorm's rows through the Tensor
Memory Accelerator close its per-call gap to a copy on Hopper?

LayerNorm kernels written for this measurement only: rows moved by TMA (host-built tensor descriptors over a
[rows, N/256, 256] view, since a TMA box is at most 256 wide), one row block per program or a persistent grid
whose loop the compiler pipelines (``tl.range(num_stages=...)``), the weight and bias in registers; against the
session-12 row-block kernel, a torch copy and a TMA copy of the same bytes. One process, interleaved, L2 flushed
per call, and again back to back in a CUDA graph.

    python benchmarks/gpu/probes/ln_tma.py   # writes $OUT/ln-tma-probe.json
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import check_and_time, ln_blk2, print_ranking, probe_data  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096
BOX = 256
K = N // BOX


@triton.jit
def _ln_block(x, w, b, eps, N: tl.constexpr):
    x = x.to(tl.float32)
    m = tl.sum(tl.sum(x, axis=2), axis=1)[:, None, None] / N
    d = x - m
    r = tl.rsqrt(tl.sum(tl.sum(d * d, axis=2), axis=1)[:, None, None] / N + eps)
    return (d * r * w + b).to(tl.bfloat16)


@triton.jit
def ln_tma(xd, yd, W, B, eps, N: tl.constexpr, ROWS: tl.constexpr, K: tl.constexpr, BOX: tl.constexpr,
           VEARLY: tl.constexpr):
    r0 = tl.program_id(0) * ROWS
    off = (tl.arange(0, K)[:, None] * BOX + tl.arange(0, BOX)[None, :])[None, :, :]
    if VEARLY:
        w = tl.load(W + off, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B + off, eviction_policy="evict_last").to(tl.float32)
    x = xd.load([r0, 0, 0])
    if not VEARLY:
        w = tl.load(W + off, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B + off, eviction_policy="evict_last").to(tl.float32)
    yd.store([r0, 0, 0], _ln_block(x, w, b, eps, N))


@triton.jit
def ln_tma_pers(xd, yd, W, B, eps, n_blk, N: tl.constexpr, ROWS: tl.constexpr, K: tl.constexpr,
                BOX: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    off = (tl.arange(0, K)[:, None] * BOX + tl.arange(0, BOX)[None, :])[None, :, :]
    w = tl.load(W + off).to(tl.float32)
    b = tl.load(B + off).to(tl.float32)
    for blk in tl.range(pid, n_blk, npg, num_stages=STAGES):
        x = xd.load([blk * ROWS, 0, 0])
        yd.store([blk * ROWS, 0, 0], _ln_block(x, w, b, eps, N))


@triton.jit
def copy_tma_pers(xd, yd, n_blk, ROWS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    for blk in tl.range(pid, n_blk, npg, num_stages=STAGES):
        yd.store([blk * ROWS, 0, 0], xd.load([blk * ROWS, 0, 0]))


def _compiled_has_tma(fn) -> object:
    """Whether the compiled kernels' TTGIR moves data with TMA (None where this triton hides its cache)."""
    try:
        caches = [c[0] for c in fn.device_caches.values()]
        return any("tma" in k.asm["ttgir"].lower() for c in caches for k in c.values())
    except Exception:
        return None


def main():
    _, xs, ys, w, b = probe_data()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def descs(rows):
        return [(TensorDescriptor.from_tensor(x.view(M, K, BOX), [rows, K, BOX]),
                 TensorDescriptor.from_tensor(y.view(M, K, BOX), [rows, K, BOX])) for x, y in zip(xs, ys)]

    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    for rows, warps in [(2, 8), (1, 8), (1, 4)]:
        tools[f"blk_R{rows}w{warps}V3L1"] = [
            (lambda a=a, o=o, r=rows, wa=warps: ln_blk2[(M // r,)](
                a, w, b, o, 1e-5, N=N, ROWS=r, VMODE=3, VEL=1, XCG=0, num_warps=wa)) for a, o in zip(xs, ys)]
    for rows, warps, ve in [(1, 4, 0), (1, 4, 1), (1, 8, 0), (1, 8, 1), (2, 8, 1), (2, 16, 1)]:
        tools[f"tma_R{rows}w{warps}E{ve}"] = [
            (lambda xd=xd, yd=yd, r=rows, wa=warps, ve=ve: ln_tma[(M // r,)](
                xd, yd, w, b, 1e-5, N=N, ROWS=r, K=K, BOX=BOX, VEARLY=ve, num_warps=wa))
            for xd, yd in descs(rows)]
    for rows, warps, per_sm, stages in [(1, 4, 2, 2), (1, 4, 2, 3), (1, 4, 4, 2), (1, 8, 1, 3), (1, 8, 2, 2),
                                        (1, 8, 2, 3), (1, 8, 1, 4), (2, 8, 1, 2), (2, 8, 1, 3), (1, 16, 1, 3)]:
        g = sms * per_sm
        tools[f"tmap_R{rows}w{warps}P{per_sm}S{stages}"] = [
            (lambda xd=xd, yd=yd, r=rows, wa=warps, g=g, st=stages: ln_tma_pers[(g,)](
                xd, yd, w, b, 1e-5, M // r, N=N, ROWS=r, K=K, BOX=BOX, STAGES=st, num_warps=wa))
            for xd, yd in descs(rows)]
    for rows, warps, per_sm, stages in [(1, 4, 2, 3), (1, 4, 4, 2), (2, 4, 2, 3)]:
        g = sms * per_sm
        tools[f"copytma_R{rows}w{warps}P{per_sm}S{stages}"] = [
            (lambda xd=xd, yd=yd, r=rows, wa=warps, g=g, st=stages: copy_tma_pers[(g,)](
                xd, yd, M // r, ROWS=r, STAGES=st, num_warps=wa)) for xd, yd in descs(rows)]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    with torch.no_grad():
        ref = F.layer_norm(xs[0], (N,), w, b, 1e-5)
        fields, floor_ms = check_and_time(tools, xs, ys, ref, ("torch_copy", "copytma"))
        res["tma_in_ttgir"] = {f.__name__: _compiled_has_tma(f) for f in (ln_tma, ln_tma_pers, copy_tma_pers)}
        res.update(fields)
    json.dump(res, open(f"{OUT}/ln-tma-probe.json", "w"), indent=1)
    print(f"floor {floor_ms * 1e3:.2f} us  bw {res['bandwidth_GBps']:.0f} GB/s  tma {res['tma_in_ttgir']}")
    print("errors", {k: round(v, 4) for k, v in res["errors_max_abs"].items()})
    print("failed", res["failed"])
    print_ranking(res, floor_ms)


if __name__ == "__main__":
    main()
