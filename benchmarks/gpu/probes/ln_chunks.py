"""Probe (not a template, never cached or served): does LayerNorm's per-call gap to a copy close when the affine
step and the store run over column chunks of the row, each chunk's weight and bias loaded after the previous
chunk is stored?

The row stays in registers for the statistics. The hypothesis: a store to the output may alias the weight and bias,
as far as the compiler knows, so the next chunk's vector loads (behind a barrier with ``BAR``) stay below it and at
most one chunk of the vectors is live next to the row. On the H200 it did not hold: ptxas gave the fp32 chunked
kernels as many registers as the one-tile kernel or more (58-63 against 58 at 2 rows and 8 warps), barrier or not.
Also timed: the affine step in bf16 (the normalized row rounded to bf16 first, ``BF``), which halves the registers
the vectors and the normalized row take, at one more rounding (the README says why it is not a template option).
Kernels written for this measurement only; against the row-block kernel of ``ln_vectors`` with and without vectors
and a torch copy of the same bytes. One process, interleaved, L2 flushed per call, and again back to back in a CUDA
graph. Registers and spills of each kernel are recorded.

    python benchmarks/gpu/probes/ln_chunks.py   # writes $OUT/ln-chunk-probe.json
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import kernel_facts, ln_blk2, print_ranking, probe_data, time_probe  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096


@triton.jit
def _affine_store(Y, off, d, r, W, B, c, BF: tl.constexpr, BAR: tl.constexpr):
    if BAR:
        tl.debug_barrier()
    w = tl.load(W + c)
    b = tl.load(B + c)
    if BF:
        y = (d * r).to(tl.bfloat16) * w + b
    else:
        y = d * r * w.to(tl.float32) + b.to(tl.float32)
    tl.store(Y + off + c, y.to(tl.bfloat16))


@triton.jit
def ln_ch2(X, W, B, Y, eps, N: tl.constexpr, ROWS: tl.constexpr, BF: tl.constexpr, BAR: tl.constexpr):
    H: tl.constexpr = N // 2
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, H)[None, :]
    off = rows.to(tl.int64) * N
    x0 = tl.load(X + off + c, eviction_policy="evict_first").to(tl.float32)
    x1 = tl.load(X + off + H + c, eviction_policy="evict_first").to(tl.float32)
    m = tl.sum(x0 + x1, axis=1)[:, None] / N
    x0 = x0 - m
    x1 = x1 - m
    r = tl.rsqrt(tl.sum(x0 * x0 + x1 * x1, axis=1)[:, None] / N + eps)
    _affine_store(Y, off, x0, r, W, B, c, BF, False)
    _affine_store(Y, off, x1, r, W, B, c + H, BF, BAR)


@triton.jit
def ln_ch4(X, W, B, Y, eps, N: tl.constexpr, ROWS: tl.constexpr, BF: tl.constexpr, BAR: tl.constexpr):
    Q: tl.constexpr = N // 4
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, Q)[None, :]
    off = rows.to(tl.int64) * N
    x0 = tl.load(X + off + c, eviction_policy="evict_first").to(tl.float32)
    x1 = tl.load(X + off + Q + c, eviction_policy="evict_first").to(tl.float32)
    x2 = tl.load(X + off + 2 * Q + c, eviction_policy="evict_first").to(tl.float32)
    x3 = tl.load(X + off + 3 * Q + c, eviction_policy="evict_first").to(tl.float32)
    m = tl.sum((x0 + x1) + (x2 + x3), axis=1)[:, None] / N
    x0 = x0 - m
    x1 = x1 - m
    x2 = x2 - m
    x3 = x3 - m
    r = tl.rsqrt(tl.sum((x0 * x0 + x1 * x1) + (x2 * x2 + x3 * x3), axis=1)[:, None] / N + eps)
    _affine_store(Y, off, x0, r, W, B, c, BF, False)
    _affine_store(Y, off, x1, r, W, B, c + Q, BF, BAR)
    _affine_store(Y, off, x2, r, W, B, c + 2 * Q, BF, BAR)
    _affine_store(Y, off, x3, r, W, B, c + 3 * Q, BF, BAR)


@triton.jit
def ln_bf1(X, W, B, Y, eps, N: tl.constexpr, ROWS: tl.constexpr):
    """One tile, vectors late, affine in bf16."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, N)[None, :]
    off = rows.to(tl.int64) * N
    x = tl.load(X + off + c, eviction_policy="evict_first").to(tl.float32)
    m = tl.sum(x, axis=1)[:, None] / N
    d = x - m
    r = tl.rsqrt(tl.sum(d * d, axis=1)[:, None] / N + eps)
    _affine_store(Y, off, d, r, W, B, c, True, False)


def _regs(fn, *args, **kw) -> dict:
    """Compile-and-run once; the kernel's facts (``kernel_facts``) and counts of its PTX."""
    h = fn(*args, **kw)
    ptx = h.asm.get("ptx", "")
    body = [ln.strip() for ln in ptx.splitlines() if ln.strip() and ln.startswith("\t") and ln.strip()[0].isalpha()]
    return {**(kernel_facts(h) or {}), "ptx_instructions": len(body),
            "fma_bf16x2": sum("fma.rn.bf16x2" in ln for ln in body), "bar_sync": sum(ln.startswith("bar.") for ln in body)}


def main():
    nsets, xs, ys, w, b = probe_data()
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    launches = {}
    for rows, warps in [(2, 8), (1, 4), (1, 8), (4, 16)]:
        for vm in (0, 1):
            launches[f"blk_R{rows}w{warps}V{vm}"] = (
                ln_blk2, M // rows, dict(N=N, ROWS=rows, VMODE=vm, VEL=0, XCG=0, num_warps=warps))
        launches[f"bf1_R{rows}w{warps}"] = (ln_bf1, M // rows, dict(N=N, ROWS=rows, num_warps=warps))
        for ch, kern in ((2, ln_ch2), (4, ln_ch4)):
            for bf, bar in ((0, 0), (0, 1), (1, 1)):
                launches[f"ch{ch}_R{rows}w{warps}BF{bf}B{bar}"] = (
                    kern, M // rows, dict(N=N, ROWS=rows, BF=bf, BAR=bar, num_warps=warps))
    with torch.no_grad():
        ref = F.layer_norm(xs[0], (N,), w, b, 1e-5)
        errs, regs = {}, {}
        for name, (kern, grid, kw) in launches.items():
            regs[name] = _regs(kern[(grid,)], xs[0], w, b, ys[0], 1e-5, **kw)
            torch.cuda.synchronize()
            if "V0" not in name:
                errs[name] = (ys[0].float() - ref.float()).abs().max().item()
            tools[name] = [(lambda a=a, o=o, k=kern, g=grid, kw=kw: k[(g,)](a, w, b, o, 1e-5, **kw))
                           for a, o in zip(xs, ys)]
        bw = T.measure_copy_bandwidth("cuda")
        floor_ms = (2 * M * N * 2 + 4 * N) / bw * 1e3
        res = {"bandwidth_GBps": bw / 1e9, "floor_ms": floor_ms, "sets": nsets, "errors_max_abs": errs,
               "registers": regs, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__}
        res.update(time_probe(tools))
    json.dump(res, open(f"{OUT}/ln-chunk-probe.json", "w"), indent=1)
    print(f"floor {floor_ms * 1e3:.2f} us  bw {bw / 1e9:.0f} GB/s")
    print("max err", {k: round(v, 4) for k, v in errs.items()})
    print("registers, spills, ptx instructions, bf16x2 fma, barriers",
          {k: (v["regs"], v["spills"], v["ptx_instructions"], v["fma_bf16x2"], v["bar_sync"]) for k, v in regs.items()})
    print_ranking(res, floor_ms)


if __name__ == "__main__":
    main()
