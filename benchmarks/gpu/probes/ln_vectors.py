"""Probe (not a template, never cached or served): what LayerNorm's weight and bias loads cost per call on a GPU.

Row-block LayerNorm kernels written for this measurement only, with and without the broadcast vectors, loaded
before or after the row statistics, with evict_last on them, with the rows read through L2 only (.cg), plus a
persistent form holding the vectors in registers; against a copy of the same bytes. One process, interleaved,
L2 flushed per call, and again back to back in a CUDA graph. It is what the rowwise template's VEVICT knob and
the README's account of LayerNorm's per-call gap rest on (benchmarks/results/ln-vector-probe-*.json).

    python benchmarks/gpu/probes/ln_vectors.py   # writes $OUT/ln-vector-probe.json
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
M = N = 4096


@triton.jit
def ln_blk2(X, W, B, Y, eps, N: tl.constexpr, ROWS: tl.constexpr, VMODE: tl.constexpr, VEL: tl.constexpr,
            XCG: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, N)[None, :]
    vpol: tl.constexpr = "evict_last" if VEL else ""
    if VMODE >= 2:
        wr = tl.load(W + cols, eviction_policy=vpol)
        br = tl.load(B + cols, eviction_policy=vpol)
    if XCG:
        x = tl.load(X + rows.to(tl.int64) * N + cols, cache_modifier=".cg")
    else:
        x = tl.load(X + rows.to(tl.int64) * N + cols, eviction_policy="evict_first")
    x = x.to(tl.float32)
    m = tl.sum(x, axis=1)[:, None] / N
    d = x - m
    r = tl.rsqrt(tl.sum(d * d, axis=1)[:, None] / N + eps)
    y = d * r
    if VMODE == 1:
        wr = tl.load(W + cols, eviction_policy=vpol)
        br = tl.load(B + cols, eviction_policy=vpol)
    if VMODE >= 1:
        y = y * wr.to(tl.float32) + br.to(tl.float32)
    tl.store(Y + rows.to(tl.int64) * N + cols, y.to(tl.bfloat16))


@triton.jit
def ln_pers2(X, W, B, Y, eps, n_blk, N: tl.constexpr, ROWS: tl.constexpr, XCG: tl.constexpr):
    """Persistent, strided row blocks; w, b raw (bf16) in registers once per program; next block prefetched."""
    pid = tl.program_id(0)
    npg = tl.num_programs(0)
    cols = tl.arange(0, N)[None, :]
    r0 = tl.arange(0, ROWS)[:, None]
    wr = tl.load(W + cols)
    br = tl.load(B + cols)
    xn = tl.load(X + (pid * ROWS + r0).to(tl.int64) * N + cols, mask=(pid * ROWS + r0) < n_blk * ROWS,
                 eviction_policy="evict_first")
    for blk in range(pid, n_blk, npg):
        off = (blk * ROWS + r0).to(tl.int64) * N + cols
        x = xn.to(tl.float32)
        nb = blk + npg
        if XCG:
            xn = tl.load(X + (nb * ROWS + r0).to(tl.int64) * N + cols, mask=(nb * ROWS + r0) < n_blk * ROWS,
                         cache_modifier=".cg")
        else:
            xn = tl.load(X + (nb * ROWS + r0).to(tl.int64) * N + cols, mask=(nb * ROWS + r0) < n_blk * ROWS,
                         eviction_policy="evict_first")
        m = tl.sum(x, axis=1)[:, None] / N
        d = x - m
        r = tl.rsqrt(tl.sum(d * d, axis=1)[:, None] / N + eps)
        tl.store(Y + off, (d * r * wr.to(tl.float32) + br.to(tl.float32)).to(tl.bfloat16))


@triton.jit
def _f32a(x):
    return x.to(tl.float32)


@triton.jit
def _f32b(x):
    # bf16 -> fp32 by its bits: a different expression, so the compiler keeps x packed instead of one wide copy
    return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _f32c(x):
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def ln_pk(X, W, B, Y, eps, N: tl.constexpr, ROWS: tl.constexpr, VEARLY: tl.constexpr):
    """x kept packed (bf16) in registers, widened at each use."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, N)[None, :]
    x = tl.load(X + rows.to(tl.int64) * N + cols, eviction_policy="evict_first")
    if VEARLY:
        wr = tl.load(W + cols)
        br = tl.load(B + cols)
    m = tl.sum(_f32a(x), axis=1)[:, None] / N
    d = _f32b(x) - m
    r = tl.rsqrt(tl.sum(d * d, axis=1)[:, None] / N + eps)
    if not VEARLY:
        wr = tl.load(W + cols)
        br = tl.load(B + cols)
    y = (_f32c(x) - m) * r * wr.to(tl.float32) + br.to(tl.float32)
    tl.store(Y + rows.to(tl.int64) * N + cols, y.to(tl.bfloat16))


def time_probe(tools: dict, rounds: int = 7) -> dict:
    """Median ms per tool, per call (L2 flushed, interleaved rounds, input sets cycled) and in the steady state
    (back to back in one CUDA graph)."""
    from benchmarks.gpu.evolve_serving_ops import _cycled
    samples = T.benchmark_interleaved({k: _cycled(v) for k, v in tools.items()}, rounds=rounds, rep_ms=60,
                                      flush=T.make_l2_flush("cuda"))
    st, err = T.benchmark_graphed(tools, rounds=5)
    return {"per_call": {k: T.summarize(v).median_ms for k, v in samples.items()},
            "stream": {k: T.summarize(v).median_ms for k, v in st.items()}, "stream_errors": err}


def kernel_facts(handle) -> dict | None:
    """Registers, spills, shared memory and async copies of the kernel a Triton launch returned (None for
    anything else, a torch call's result say)."""
    if not hasattr(handle, "n_regs"):
        return None
    return {"regs": handle.n_regs, "spills": handle.n_spills, "shared": handle.metadata.shared,
            "async_copies": handle.asm.get("ttgir", "").count("async_copy_global_to_local")}


def winner(results: dict, op: str) -> tuple:
    """The reference model of ``op``'s problem (seeded as the optimizer seeds it) and the winner a results file of
    ``evolve_serving_ops.py`` holds, with the reference's weights, both on the GPU."""
    from benchmarks.gpu.evolve_serving_ops import OPS, PROBLEM_DIR
    from ks_inductor.problem import exec_problem_source, load_problem

    pm = exec_problem_source(load_problem(PROBLEM_DIR / OPS[op]).source)
    return _with_reference(pm, results["ops"][op]["best_source"])


def configured_model(op: str, params: dict, edit=None, variant: str = "rowwise/block") -> tuple:
    """As ``winner``, for ``variant`` (the row-wise block one unless told) of ``op`` rendered with ``params`` over
    its defaults (``sass_counts.render_config``), its source passed through ``edit`` first when one is given."""
    from benchmarks.gpu.evolve_serving_ops import OPS, PROBLEM_DIR
    from benchmarks.sass_counts import render_config

    src, pm = render_config(str(PROBLEM_DIR / OPS[op]), variant, params)
    return _with_reference(pm, edit(src) if edit else src)


def _with_reference(pm, source: str) -> tuple:
    from benchmarks.kernelsmith_peer import build_kernel_model

    torch.manual_seed(0)
    ref = pm.Model(*pm.get_init_inputs()).cuda().eval()
    return ref, build_kernel_model(source, pm.get_init_inputs(), ref, "cuda")


def first_calls(tools: dict, out: torch.Tensor, on_first) -> dict:
    """Run each tool once on the first set (``out`` filled with NaN before each), dropping (and reporting) a variant
    this triton cannot compile. ``on_first(name, result)`` sees each call's return value (a launch's compiled
    kernel) while ``out`` holds what that call wrote. Returns the failures."""
    failed = {}
    for name in list(tools):
        try:
            out.fill_(float("nan"))
            got = tools[name][0]()
            torch.cuda.synchronize()
        except Exception as e:  # a variant this triton cannot compile is reported, not fatal
            failed[name] = f"{type(e).__name__}: {str(e)[:300]}"
            del tools[name]
            continue
        on_first(name, got)
    return failed


def check_and_time(tools: dict, xs: list, ys: list, ref: torch.Tensor, copies: tuple[str, ...],
                   on_first=None) -> tuple[dict, float]:
    """Run each tool once on the first set (``first_calls``); record its largest error against ``ref``, or against
    its input for the tools named with a prefix in ``copies``; then measure the copy bandwidth and time the tools
    left. ``on_first(name, result)`` sees each first call's return value. Returns the result fields and the floor
    in ms."""
    errs = {}

    def check(name, got):
        if on_first is not None:
            on_first(name, got)
        want = xs[0] if name.startswith(copies) else ref
        errs[name] = (ys[0].float() - want.float()).abs().max().item()

    failed = first_calls(tools, ys[0], check)
    res = {**timed_against_floor(tools), "sets": len(xs), "errors_max_abs": errs, "failed": failed}
    return res, res["floor_ms"]


def timed_against_floor(tools: dict) -> dict:
    """The copy bandwidth, the norms' floor at it (rows in and out, weight and bias), and ``time_probe(tools)``."""
    bw = T.measure_copy_bandwidth("cuda")
    return {"bandwidth_GBps": bw / 1e9, "floor_ms": (2 * M * N * 2 + 4 * N) / bw * 1e3, **time_probe(tools)}


def print_ranking(res: dict, floor_ms: float) -> None:
    for k in sorted(res["per_call"], key=res["per_call"].get):
        pc = res["per_call"][k]
        s = res["stream"].get(k, float("nan"))
        print(f"{k:28s} per-call {pc * 1e3:6.2f} us {floor_ms / pc:5.1%}   stream {s * 1e3:6.2f} us {floor_ms / s:5.1%}")


def probe_data() -> tuple[int, list, list, torch.Tensor, torch.Tensor]:
    """Input sets that with their outputs exceed four times the L2, their outputs, and one weight and bias."""
    nsets = T.cold_set_count(2 * M * N * 2, T.device_l2_bytes())
    torch.manual_seed(0)
    xs = [torch.randn(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(nsets)]
    ys = [torch.empty_like(x) for x in xs]
    w = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    return nsets, xs, ys, w, b


def main():
    nsets, xs, ys, w, b = probe_data()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    cfg = []
    for rows, warps in [(2, 8), (2, 16), (1, 4), (1, 8)]:
        cfg += [(rows, warps, 0, 0, 0), (rows, warps, 1, 0, 0), (rows, warps, 1, 1, 0), (rows, warps, 1, 0, 1),
                (rows, warps, 1, 1, 1), (rows, warps, 3, 0, 0), (rows, warps, 3, 1, 1)]
    cfg += [(4, 16, 1, 1, 1), (4, 8, 1, 1, 1)]
    for rows, warps, vm, vel, xcg in cfg:
        tools[f"blk_R{rows}w{warps}V{vm}L{vel}C{xcg}"] = [
            (lambda a=a, o=o, r=rows, wa=warps, vm=vm, vel=vel, xcg=xcg: ln_blk2[(M // r,)](
                a, w, b, o, 1e-5, N=N, ROWS=r, VMODE=vm, VEL=vel, XCG=xcg, num_warps=wa))
            for a, o in zip(xs, ys)]
    for rows, warps, ve in [(2, 8, 0), (2, 8, 1), (2, 16, 0)]:
        tools[f"pk_R{rows}w{warps}E{ve}"] = [
            (lambda a=a, o=o, r=rows, wa=warps, ve=ve: ln_pk[(M // r,)](
                a, w, b, o, 1e-5, N=N, ROWS=r, VEARLY=ve, num_warps=wa)) for a, o in zip(xs, ys)]
    for rows, warps, waves, xcg in [(1, 8, 3, 0), (1, 8, 3, 1), (1, 4, 4, 0), (1, 4, 4, 1), (1, 16, 2, 0),
                                    (2, 16, 2, 0), (2, 8, 2, 1), (1, 8, 2, 0)]:
        g = sms * waves
        tools[f"pers_R{rows}w{warps}W{waves}C{xcg}"] = [
            (lambda a=a, o=o, r=rows, wa=warps, g=g, xcg=xcg: ln_pers2[(g,)](
                a, w, b, o, 1e-5, M // r, N=N, ROWS=r, XCG=xcg, num_warps=wa)) for a, o in zip(xs, ys)]
    with torch.no_grad():
        ref = F.layer_norm(xs[0], (N,), w, b, 1e-5)
        errs = {}
        for name, calls in tools.items():
            if name == "torch_copy" or "V0" in name:
                continue
            calls[0]()
            torch.cuda.synchronize()
            errs[name] = (ys[0].float() - ref.float()).abs().max().item()
        bw = T.measure_copy_bandwidth("cuda")
        floor_ms = (2 * M * N * 2 + 4 * N) / bw * 1e3
        res = {"bandwidth_GBps": bw / 1e9, "floor_ms": floor_ms, "sets": nsets, "errors_max_abs": errs,
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
        res.update(time_probe(tools))
    json.dump(res, open(f"{OUT}/ln-vector-probe.json", "w"), indent=1)
    print(f"floor {floor_ms * 1e3:.2f} us  bw {bw / 1e9:.0f} GB/s")
    print("max err", max(errs.values()))
    print_ranking(res, floor_ms)


if __name__ == "__main__":
    main()
