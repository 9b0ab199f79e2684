"""Probe (not a template, never cached or served): what a per-call time of a 64 MiB op is made of, and why it moves
from one process to the next.

On the norms' bytes (4096 x 4096 bf16 in and out) the judge's per-call protocol (L2 flushed, a spin, then the call
between two events) times, in one process and interleaved: a launch of the norms' grid that does nothing, one that
only reads the input, one that only writes the output, a Triton copy of that shape, torch's copy, and the LayerNorm
and RMSNorm winners read from a results file. Every input set is also timed on its own, so a set (a placement of
its buffers) that is slower than the others shows; and the buffers' addresses are recorded. Run it in several
processes with ``nvidia-smi --query-gpu=... -lms`` beside it to see whether clocks follow the process.

    python benchmarks/gpu/probes/per_call_parts.py RESULTS.json TAG   # writes $OUT/per-call-parts-TAG.json
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
from benchmarks.gpu.evolve_serving_ops import _cycled  # noqa: E402
from benchmarks.gpu.probes.ln_vectors import winner  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096
ROWS, WARPS = 2, 8  # the norms' winners' launch shape


@triton.jit
def nothing(X, N: tl.constexpr):
    pass


@triton.jit
def read_only(X, S, N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    x = tl.load(X + rows.to(tl.int64) * N + tl.arange(0, N)[None, :], eviction_policy="evict_first")
    tl.store(S + tl.program_id(0), tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0))


@triton.jit
def write_only(Y, N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    tl.store(Y + rows.to(tl.int64) * N + tl.arange(0, N)[None, :], tl.zeros([ROWS, N], tl.bfloat16))


@triton.jit
def row_copy(X, Y, N: tl.constexpr, ROWS: tl.constexpr):
    off = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64) * N + tl.arange(0, N)[None, :]
    tl.store(Y + off, tl.load(X + off, eviction_policy="evict_first"))


def main():
    results = json.loads(Path(sys.argv[1]).read_text())
    tag = sys.argv[2]
    nsets = T.cold_set_count(2 * M * N * 2, T.device_l2_bytes())
    torch.manual_seed(0)
    xs = [torch.randn(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(nsets)]
    ys = [torch.empty_like(x) for x in xs]
    sums = torch.empty(M // ROWS, dtype=torch.float32, device="cuda")
    g = (M // ROWS,)
    per_set = {
        "nothing": [(lambda a=a: nothing[g](a, N=N, num_warps=WARPS)) for a in xs],
        "read_only": [(lambda a=a: read_only[g](a, sums, N=N, ROWS=ROWS, num_warps=WARPS)) for a in xs],
        "write_only": [(lambda o=o: write_only[g](o, N=N, ROWS=ROWS, num_warps=WARPS)) for o in ys],
        "triton_copy": [(lambda a=a, o=o: row_copy[g](a, o, N=N, ROWS=ROWS, num_warps=WARPS)) for a, o in zip(xs, ys)],
        "torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)],
    }
    errs = {}
    with torch.no_grad():
        for op in ("layernorm", "rmsnorm"):
            ref, best = winner(results, op)
            per_set[op] = [(lambda a=a, m=best: m(a)) for a in xs]
            errs[op] = (best(xs[0]).float() - ref(xs[0]).float()).abs().max().item()
        for calls in per_set.values():
            calls[0]()
        torch.cuda.synchronize()
        bw = T.measure_copy_bandwidth("cuda")
        floor_ms = 2 * M * N * 2 / bw * 1e3
        t0 = time.time()
        # Each set on its own, per call (after the flush no set's data is in L2, so one set is as cold as many).
        single = {f"{k}#{i}": [c] for k, calls in per_set.items() for i, c in enumerate(calls)}
        samples = T.benchmark_interleaved({k: _cycled(v) for k, v in single.items()}, rounds=7, rep_ms=30,
                                          flush=T.make_l2_flush("cuda"))
        by_set = {k: T.summarize(v).median_ms for k, v in samples.items()}
        t1 = time.time()
        st, st_err = T.benchmark_graphed(per_set, rounds=5)
        stream = {k: T.summarize(v).median_ms for k, v in st.items()}
        t2 = time.time()
    per_call = {k: sorted(by_set[f"{k}#{i}"] for i in range(nsets))[nsets // 2] for k in per_set}
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "tag": tag, "pid": os.getpid(), "wall_start": t0, "wall_per_call_end": t1, "wall_end": t2,
           "bandwidth_GBps": bw / 1e9, "floor_ms": floor_ms, "sets": nsets, "errors_max_abs": errs,
           "addresses": {"x": [x.data_ptr() for x in xs], "y": [y.data_ptr() for y in ys]},
           "per_set_ms": by_set, "per_call_ms": per_call, "stream_ms": stream, "stream_errors": st_err}
    Path(OUT, f"per-call-parts-{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"[{tag}] floor {floor_ms * 1e3:.2f} us, {bw / 1e9:.0f} GB/s, errors {errs}")
    for k in per_set:
        sets = " ".join(f"{by_set[f'{k}#{i}'] * 1e3:5.2f}" for i in range(nsets))
        print(f"[{tag}] {k:12s} per call {per_call[k] * 1e3:6.2f} us {floor_ms / per_call[k]:6.1%} (sets {sets})"
              f"  stream {stream.get(k, float('nan')) * 1e3:6.2f} us")


if __name__ == "__main__":
    main()
