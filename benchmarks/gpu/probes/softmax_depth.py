"""Probe (not a template, never cached or served): what holds the 4096 x 32000 bf16 softmax at 85% of a copy?

The product's winner (rowwise/prefetch: one 1,024-thread program per SM, the next row prefetched in registers)
leaves about 15% to a copy of its bytes. Two readings: the launch shape (one program per SM, one row in flight
while a row is reduced) keeps too few bytes in flight, or the compute between the loads does. The probe times
copies with the winner's shape and nothing between load and store, with one or two rows held ahead in registers
or staged through shared memory by the pipeliner (``tl.range(num_stages=...)``, cp.async), and softmaxes of each
shape; against the winner, read from a results file, and a torch copy. One process, interleaved, L2 flushed per
call, then back to back in a CUDA graph.

    python benchmarks/gpu/probes/softmax_depth.py RESULTS.json   # the winner's best_source; writes $OUT/softmax-depth-probe.json
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import first_calls, kernel_facts, time_probe, winner  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
M, N = 4096, 32000
BLOCK = triton.next_power_of_2(N)
LOG2E = 1.4426950408889634


@triton.jit
def _ex2(x):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _softmax_row(x, cm):
    xf = tl.where(cm, x.to(tl.float32), -float("inf"))
    m = tl.max(xf, axis=0)
    e = tl.where(cm, _ex2(xf * 1.4426950408889634 - m * 1.4426950408889634), 0.0)
    return (e * (1.0 / tl.sum(e, axis=0))).to(tl.bfloat16)


@triton.jit
def held(X, Y, n_rows, N: tl.constexpr, BLOCK: tl.constexpr, DEPTH: tl.constexpr, SOFTMAX: tl.constexpr):
    """Persistent; DEPTH rows ahead held raw in registers, loop-carried."""
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    cm = cols < N
    a = tl.load(X + pid.to(tl.int64) * N + cols, mask=cm & (pid < n_rows), other=0.0, eviction_policy="evict_first")
    if DEPTH == 2:
        r1 = pid + npg
        b = tl.load(X + r1.to(tl.int64) * N + cols, mask=cm & (r1 < n_rows), other=0.0,
                    eviction_policy="evict_first")
    for row in range(pid, n_rows, npg):
        cur = a
        if DEPTH == 2:
            a = b
            nxt = row + 2 * npg
            b = tl.load(X + nxt.to(tl.int64) * N + cols, mask=cm & (nxt < n_rows), other=0.0,
                        eviction_policy="evict_first")
        else:
            nxt = row + npg
            a = tl.load(X + nxt.to(tl.int64) * N + cols, mask=cm & (nxt < n_rows), other=0.0,
                        eviction_policy="evict_first")
        if SOFTMAX:
            y = _softmax_row(cur, cm)
        else:
            y = cur
        tl.store(Y + row.to(tl.int64) * N + cols, y, mask=cm)


@triton.jit
def staged(X, Y, n_rows, N: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, SOFTMAX: tl.constexpr):
    """Persistent; the pipeliner stages the row loads through shared memory."""
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    cm = cols < N
    for row in tl.range(pid, n_rows, npg, num_stages=STAGES):
        x = tl.load(X + row.to(tl.int64) * N + cols, mask=cm, other=0.0, eviction_policy="evict_first")
        if SOFTMAX:
            y = _softmax_row(x, cm)
        else:
            y = x
        tl.store(Y + row.to(tl.int64) * N + cols, y, mask=cm)


def main():
    _, win = winner(json.loads(Path(sys.argv[1]).read_text()), "softmax")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nsets = T.cold_set_count(2 * M * N * 2, T.device_l2_bytes())
    torch.manual_seed(0)
    xs = [torch.randn(M, N, dtype=torch.bfloat16, device="cuda") * 4 for _ in range(nsets)]
    ys = [torch.empty_like(x) for x in xs]
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)],
             "ks_winner": [(lambda a=a: win(a)) for a in xs]}  # allocates its output, as it does when served
    for sm in (0, 1):
        for depth, warps in [(1, 32), (2, 32), (1, 16), (2, 16)]:
            name = f"{'sm' if sm else 'copy'}_held_D{depth}w{warps}"
            tools[name] = [(lambda a=a, o=o, d=depth, w=warps, s=sm: held[(sms,)](
                a, o, M, N=N, BLOCK=BLOCK, DEPTH=d, SOFTMAX=s, num_warps=w)) for a, o in zip(xs, ys)]
        for stages, warps in [(2, 32), (3, 32), (2, 16), (3, 16)]:
            name = f"{'sm' if sm else 'copy'}_staged_S{stages}w{warps}"
            tools[name] = [(lambda a=a, o=o, st=stages, w=warps, s=sm: staged[(sms,)](
                a, o, M, N=N, BLOCK=BLOCK, STAGES=st, SOFTMAX=s, num_warps=w)) for a, o in zip(xs, ys)]
    ref = torch.softmax(xs[0].float(), dim=-1).to(torch.bfloat16)
    errs, facts = {}, {}

    def check(name, got):
        facts[name] = kernel_facts(got)
        out = got if name == "ks_winner" else ys[0]
        want = xs[0] if "copy" in name else ref
        errs[name] = (out.float() - want.float()).abs().max().item()

    failed = first_calls(tools, ys[0], check)
    bw = T.measure_copy_bandwidth("cuda")
    floor_ms = 2 * M * N * 2 / bw * 1e3
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "bandwidth_GBps": bw / 1e9, "floor_ms": floor_ms, "sets": nsets, "errors_max_abs": errs,
           "failed": failed, "kernels": facts}
    res.update(time_probe(tools))
    res["timing_s"] = time.time() - t0
    Path(OUT, "softmax-depth-probe.json").write_text(json.dumps(res, indent=1))
    print(f"floor {floor_ms * 1e3:.1f} us, {bw / 1e9:.0f} GB/s; failed: {list(failed)}")
    for k in sorted(res["per_call"], key=res["per_call"].get):
        pc, st = res["per_call"][k], res["stream"].get(k, float("nan"))
        print(f"{k:24s} per call {pc * 1e3:7.1f} us {floor_ms / pc:6.1%}  stream {st * 1e3:7.1f} us "
              f"{floor_ms / st:6.1%}  err {errs.get(k, float('nan')):.2g}  {facts.get(k)}")


if __name__ == "__main__":
    main()
