"""Probe (not a template, never cached or served): can a persistent LayerNorm whose row loads the compiler
pipelines through shared memory (``tl.range(num_stages=...)``, cp.async on Hopper) close the per-call gap to a copy?

The hypothesis: in the one-block kernels, the bytes an SM has in flight are bounded by the registers the row tiles
take, and a block waits for none of its loads while it reduces and stores. With the loads of the next row blocks
copied asynchronously into shared memory, the bytes in flight no longer depend on the registers. ``VIN`` loads the
weight and bias inside the loop (the pipeliner then stages them too) instead of holding them in registers across it.
Also timed: the same loop as a plain copy, the one-block kernels of ``ln_vectors``, and a torch copy of the same
bytes. One process, interleaved, L2 flushed per call, and again back to back in a CUDA graph. Registers, shared
memory and whether the compiled kernel copies asynchronously are recorded.

On the H200 (triton 3.6) the hypothesis did not hold, in two processes. Every form copied asynchronously (cp.async
into 16-74 KB of shared memory), and every one lost to the 2-row 8-warp block kernel: 19.2-29.8 us per call against
18.6 and 19.8 (copy 18.1 and 19.2), and 19.6-28.5 back to back against 19.4 and 19.5. With the vectors held across
the loop the kernel takes 69-110 registers; with them loaded in the loop the pipeliner stages them too, and it still
takes 51-80. The same loop as a plain copy ran within 0.5 us of torch's copy per call, and 0.7-1.0 us behind it
back to back (benchmarks/results/ln-pipeline-probe-nvidia-h200-2026-11-23-run{1,2}.json).

    python benchmarks/gpu/probes/ln_pipeline.py   # writes $OUT/ln-pipeline-probe.json
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import (  # noqa: E402
    check_and_time,
    kernel_facts,
    ln_blk2,
    print_ranking,
    probe_data,
)

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096


@triton.jit
def ln_pipe(X, W, B, Y, eps, n_blk, N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr, VIN: tl.constexpr):
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    cols = tl.arange(0, N)[None, :]
    if not VIN:
        w0 = tl.load(W + cols)
        b0 = tl.load(B + cols)
    for blk in tl.range(pid, n_blk, npg, num_stages=STAGES):
        off = (blk * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64) * N + cols
        x = tl.load(X + off, eviction_policy="evict_first").to(tl.float32)
        m = tl.sum(x, axis=1)[:, None] / N
        d = x - m
        r = tl.rsqrt(tl.sum(d * d, axis=1)[:, None] / N + eps)
        if VIN:
            w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
            b = tl.load(B + cols, eviction_policy="evict_last").to(tl.float32)
        else:
            w = w0.to(tl.float32)
            b = b0.to(tl.float32)
        tl.store(Y + off, (d * r * w + b).to(tl.bfloat16))


@triton.jit
def copy_pipe(X, Y, n_blk, N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    cols = tl.arange(0, N)[None, :]
    for blk in tl.range(pid, n_blk, npg, num_stages=STAGES):
        off = (blk * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64) * N + cols
        tl.store(Y + off, tl.load(X + off, eviction_policy="evict_first"))


def main():
    _, xs, ys, w, b = probe_data()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    for rows, warps in [(2, 8), (1, 8)]:
        tools[f"blk_R{rows}w{warps}V3L1"] = [
            (lambda a=a, o=o, r=rows, wa=warps: ln_blk2[(M // r,)](
                a, w, b, o, 1e-5, N=N, ROWS=r, VMODE=3, VEL=1, XCG=0, num_warps=wa)) for a, o in zip(xs, ys)]
    for rows, warps, per_sm, stages in [(1, 4, 4, 3), (2, 8, 3, 3), (1, 8, 4, 4)]:
        g = sms * per_sm
        tools[f"copypipe_R{rows}w{warps}P{per_sm}S{stages}"] = [
            (lambda a=a, o=o, r=rows, wa=warps, g=g, st=stages: copy_pipe[(g,)](
                a, o, M // r, N=N, ROWS=r, STAGES=st, num_warps=wa)) for a, o in zip(xs, ys)]
    cfgs = [(2, 8, 2, 2, 1), (2, 8, 3, 2, 1), (2, 8, 2, 3, 1), (2, 8, 3, 3, 1), (1, 8, 4, 3, 1), (1, 8, 3, 4, 1),
            (1, 8, 4, 2, 1), (1, 4, 4, 3, 1), (1, 4, 8, 2, 1), (2, 16, 2, 3, 1), (2, 16, 3, 2, 1),
            (1, 8, 4, 3, 0), (2, 8, 2, 3, 0), (1, 8, 4, 1, 1), (2, 8, 4, 1, 1)]
    for rows, warps, per_sm, stages, vin in cfgs:
        g = sms * per_sm
        tools[f"pipe_R{rows}w{warps}P{per_sm}S{stages}V{vin}"] = [
            (lambda a=a, o=o, r=rows, wa=warps, g=g, st=stages, vin=vin: ln_pipe[(g,)](
                a, w, b, o, 1e-5, M // r, N=N, ROWS=r, STAGES=st, VIN=vin, num_warps=wa)) for a, o in zip(xs, ys)]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    with torch.no_grad():
        ref = F.layer_norm(xs[0], (N,), w, b, 1e-5)
        compiled = {}

        def record(name, got):
            facts = kernel_facts(got)
            if facts is not None:
                compiled[name] = facts

        fields, floor_ms = check_and_time(tools, xs, ys, ref, ("torch_copy", "copypipe"), record)
        res.update(fields)
        res["compiled_by_tool"] = compiled
    json.dump(res, open(f"{OUT}/ln-pipeline-probe.json", "w"), indent=1)
    print(f"floor {floor_ms * 1e3:.2f} us  bw {res['bandwidth_GBps']:.0f} GB/s")
    print("errors", {k: round(v, 4) for k, v in res["errors_max_abs"].items()}, "failed", res["failed"])
    print(json.dumps(compiled))
    print_ranking(res, floor_ms)


if __name__ == "__main__":
    main()
