"""The Llama-style decoder layer of shared/anchors/measure_layer.py with the kernelsmith backend, on a GPU.

bf16, random weights (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, head dim 128). Two phases: prefill
(1 x 4096 tokens) and decode (16 sequences x 1 token, 2048 cached). Steps:

1. warm: the backend's regions of the layer in both phases (``ks_inductor.compiler.explain``) are evolved with the embedded
   mutator into a fresh kernel cache, within a judgment budget per region and a wall-time cap (decode first:
   that is where the room is);
2. compile every variant (eager, Inductor default, max-autotune-no-cudagraphs, max-autotune, kernelsmith in
   default mode with and without its graph guard, kernelsmith with max-autotune-no-cudagraphs, and a second
   compile of Inductor as a noise yardstick), each timed right away with the anchor's protocol
   (``triton.testing.do_bench``, median: ``*_dobench_ms``);
3. time the compiled graphs again, interleaved: shuffled rounds of back-to-back calls of each graph on the same
   inputs (``*_ms``), with the ratio to Inductor and its lower confidence bound. Decode is bound by the host's
   kernel launches on this machine, and the host's speed drifts within a run, so only interleaved timings can
   be compared; do_bench's cache flush between calls also hides part of the launch time;
4. report time ratios, the largest absolute error against eager, compile times (cold and cache-warm) of Inductor
   and of a kernelsmith compile that hits the cache, and the region hit/miss table.

    python benchmarks/gpu/decoder_layer.py $OUT/decoder_layer.json --budget 6 --region-time 25 --warm-time 210

The layer is re-implemented here (the shared folder is not on the GPU machine). Stages past ``--deadline``
seconds are skipped and say so in the JSON, so the run fits its time slot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

H, FF, NH, KV, D = 4096, 14336, 32, 8, 128
PHASES = {"decode_B16_ctx2048": (16, 1, 2048), "prefill_T4096": (1, 4096, 0)}


def build_layer(device: str, dtype: Any) -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMS(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(H))

        def forward(self, x: Any) -> Any:
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w

    def rot(x: Any) -> Any:
        return torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = RMS(), RMS()
            self.q = nn.Linear(H, NH * D, bias=False)
            self.k = nn.Linear(H, KV * D, bias=False)
            self.v = nn.Linear(H, KV * D, bias=False)
            self.o = nn.Linear(NH * D, H, bias=False)
            self.g = nn.Linear(H, FF, bias=False)
            self.u = nn.Linear(H, FF, bias=False)
            self.d = nn.Linear(FF, H, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, kc: Any, vc: Any) -> Any:
            B, T, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, NH, D).transpose(1, 2)
            k = self.k(h).view(B, T, KV, D).transpose(1, 2)
            v = self.v(h).view(B, T, KV, D).transpose(1, 2)
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
            k = torch.cat([kc, k], 2)
            v = torch.cat([vc, v], 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=kc.shape[2] == 0, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, NH * D))
            h = self.n2(x)
            return x + self.d(F.silu(self.g(h)) * self.u(h))

    torch.manual_seed(0)
    return Layer().to(device, dtype).eval()


def make_inputs(B: int, T: int, P: int, device: str, dtype: Any) -> tuple:
    import torch

    x = torch.randn(B, T, H, device=device, dtype=dtype)
    pos = torch.arange(P, P + T, device=device).float()
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=device).float() / D))
    fr = torch.outer(pos, inv)
    emb = torch.cat([fr, fr], -1)
    return (x, emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None],
            torch.randn(B, KV, P, D, device=device, dtype=dtype), torch.randn(B, KV, P, D, device=device, dtype=dtype))


class Clock:
    def __init__(self, deadline_s: float) -> None:
        self.t0 = time.time()
        self.deadline = deadline_s

    def left(self) -> float:
        return self.deadline - (time.time() - self.t0)


def warm_layer(layer: Any, phase_inputs: dict[str, tuple], db: str, budget: int, region_time: float,
               warm_time: float, kinds: list[str] | None = None) -> dict[str, Any]:
    from kernel_cache.access import open_store
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.warm import problems_from_model, warm

    t0 = time.time()
    problems: list[Any] = []
    seen: set[str] = set()
    for inputs in phase_inputs.values():  # decode first
        for p in problems_from_model(layer, inputs, db=db):
            if p.key not in seen:
                seen.add(p.key)
                problems.append(p)
    if kinds:
        # only the regions whose name starts with one of ``kinds``, in that order (the rest stay misses)
        rank = {p.key: next((i for i, k in enumerate(kinds) if p.name.startswith(k)), None) for p in problems}
        problems = sorted((p for p in problems if rank[p.key] is not None), key=lambda p: rank[p.key])
    out: dict[str, Any] = {"regions": len(problems), "items": [], "skipped_for_time": []}
    store = open_store(db)
    config = EvolveConfig(budget=budget, time_limit_s=region_time)
    with Judge(JudgeConfig.for_search()) as judge:
        for p in problems:
            if time.time() - t0 > warm_time:
                out["skipped_for_time"].append({"key": p.key, "name": p.name})
                continue
            summary = warm([p], store, config, judge=judge, origin="decoder_layer")
            out["items"] += summary.to_json()["items"]
    store.close()
    out["wall_s"] = time.time() - t0
    return out


# (name, mode, kernelsmith): kernelsmith is False (plain Inductor), True, or a dict of extra kernelsmith options.
# "kernelsmith-noguard" turns the graph guard off: what the swaps alone do to the graph, which the guard judges.
# The "-repeat" rows compile plain Inductor once more: how far two compiles of the same graph differ is the
# yardstick for any kernelsmith/Inductor ratio near 1.
MAIN_VARIANTS = [("inductor", None, False), ("kernelsmith", None, True),
                 ("kernelsmith-noguard", None, {"kernelsmith.graph_guard": "off"}), ("inductor-repeat", None, False)]
AUTOTUNE_VARIANTS = [("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", False),
                     ("max-autotune", "max-autotune", False),
                     ("kernelsmith+max-autotune", "max-autotune", True),
                     ("kernelsmith+max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", True),
                     ("max-autotune-no-cudagraphs-repeat", "max-autotune-no-cudagraphs", False)]
CUDAGRAPH_MODES = ("max-autotune", "reduce-overhead")


def time_variants(layer: Any, inputs: tuple, db: str, clock: Clock, variants: list[tuple[str, str | None, Any]],
                  row: dict[str, Any], rounds: int = 9) -> None:
    """Compile and do_bench each variant, then time the compiled graphs interleaved (see the module doc)."""
    import torch

    from ks_inductor.compiler import backend as ksb
    from ks_inductor.compiler.graph_guard import GuardConfig, interleaved_batches
    from ks_inductor.judge.timing import ratio_with_lcb

    graphs: dict[str, tuple[Any, list[Any]]] = {}
    with torch.no_grad():
        ref = layer(*inputs)
        row["eager_dobench_ms"] = bench(lambda: layer(*inputs))
        graphs["eager"] = (layer, list(inputs))
        for name, mode, ks in variants:
            if clock.left() < 60:
                row[name + "_skipped"] = "deadline"
                continue
            try:
                res, captured = _time_variant(layer, inputs, ref, name, mode, ks, db, ksb)
                row.update(res)
            except Exception as e:  # noqa: BLE001 - record, keep measuring the others
                row[name + "_error"] = f"{type(e).__name__}: {e}"[:800]
                traceback.print_exc()
                continue
            if mode in CUDAGRAPH_MODES:
                row[name + "_interleaved"] = ("no: CUDA-graph trees do not outlive a Dynamo reset; timed back to "
                                              "back right after its compile instead (*_seq_ms)")
            elif len(captured) != 1:
                row[name + "_interleaved"] = f"no: {len(captured)} graphs"
            else:
                graphs[name] = captured[0]
        fns = {n: (lambda f=f, a=a: f(*a)) for n, (f, a) in graphs.items()}
        device = "cuda" if torch.cuda.is_available() else "cpu"
        samples = interleaved_batches(fns, device, GuardConfig(rounds=rounds, round_ms=40.0, budget_s=120.0))
    for name, rounds_ in samples.items():
        row[name + "_ms"] = statistics.median(x for r in rounds_ for x in r)
    if device == "cuda":
        with torch.no_grad():
            for name, fn in fns.items():
                try:
                    row[name + "_gpu_ms"] = graph_replay_ms(fn)
                except Exception as e:  # noqa: BLE001 - a graph that cannot be captured is reported, not fatal
                    row[name + "_gpu_error"] = f"{type(e).__name__}: {e}"[:300]
    if "inductor" in samples:
        for name in samples:
            if name.startswith("kernelsmith"):
                base = "max-autotune-no-cudagraphs" if "max-autotune" in name else "inductor"
                if base in samples:
                    # the ratio itself is ratios()'s {base}_over_{name}, from the same medians
                    row[f"{base}_over_{name}_lcb"] = ratio_with_lcb(samples[base], samples[name])[1]


def ratios(row: dict[str, Any]) -> None:
    names = [k[:-3] for k in row if k.endswith("_ms") and not k.endswith(("_dobench_ms", "_gpu_ms"))]
    for name in names:
        if name != "eager" and "eager_ms" in row:
            row[f"eager_over_{name}"] = row["eager_ms"] / row[name + "_ms"]
    pairs = [(base, ks) for ks in ("kernelsmith", "kernelsmith-noguard", "kernelsmith+max-autotune-no-cudagraphs")
             for base in ("inductor", "max-autotune-no-cudagraphs")]
    for base, ks in pairs:
        for kind in ("_ms", "_gpu_ms"):
            if base + kind in row and ks + kind in row:
                row[f"{base}_over_{ks}{kind[:-3]}"] = row[base + kind] / row[ks + kind]
    # CUDA-graph modes are not interleaved (their graph trees do not outlive a Dynamo reset): do_bench and
    # back-to-back right after their compile (_seq_ms)
    for kind in ("_dobench_ms", "_seq_ms"):
        if "max-autotune" + kind in row and "kernelsmith+max-autotune" + kind in row:
            row[f"max-autotune_over_kernelsmith+max-autotune{kind[:-3]}"] = (
                row["max-autotune" + kind] / row["kernelsmith+max-autotune" + kind])


def graph_replay_ms(fn: Any, calls: int = 10, replays: int = 15) -> float:
    """GPU time per call with the host taken out: ``calls`` calls captured in one CUDA graph, median of
    ``replays`` replays. Back-to-back timing above includes each variant's launch cost on this host; this
    isolates what its kernels cost the GPU (what CUDA-graph serving would see)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def bench(fn: Any) -> float:
    """Median ms: the anchor's ``do_bench`` on a GPU; a plain timer on CPU (smoke runs only)."""
    import torch

    if torch.cuda.is_available():
        from triton.testing import do_bench

        return float(do_bench(fn, return_mode="median"))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _compile(layer: Any, mode: str | None, ks: Any, db: str, captured: list) -> Any:
    """``ks``: False for plain Inductor, True for kernelsmith, or a dict of extra kernelsmith options. Each graph
    the backend compiles is appended to ``captured`` with its example inputs, to be timed on its own later."""
    import torch

    from ks_inductor.compiler.backend import kernelsmith_backend

    def capture(inner: Any) -> Any:
        def backend(gm: Any, example_inputs: list, **kwargs: Any) -> Any:
            compiled = inner(gm, example_inputs, **kwargs)
            captured.append((compiled, list(example_inputs)))
            return compiled
        return backend

    if ks:
        # torch.compile takes mode= or options=, not both: the mode travels as a kernelsmith option.
        extra = ks if isinstance(ks, dict) else {}
        return torch.compile(layer, backend=capture(kernelsmith_backend),
                             options={"kernelsmith.db": db, "kernelsmith.mode": mode, **extra})
    inductor = torch._TorchCompileInductorWrapper(mode, None, False)
    return torch.compile(layer, backend=capture(lambda gm, ex, **_: inductor(gm, ex)))


def _time_variant(layer: Any, inputs: tuple, ref: Any, name: str, mode: str | None, ks: Any, db: str,
                  ksb: Any) -> tuple[dict[str, Any], list]:
    import torch
    from torch._dynamo.utils import counters

    counters.clear()
    row: dict[str, Any] = {}
    # A cold compile (first time this graph is seen in this process's fresh Inductor cache), then a warm one
    # (Inductor's FX/AOT caches now hold it), whose graph is kept for the interleaved timing.
    torch._dynamo.reset()
    n_reports = len(ksb.compile_reports())
    t0 = time.time()
    cm = _compile(layer, mode, ks, db, [])
    out = cm(*inputs).clone()
    _sync()
    row[name + "_compile_s"] = time.time() - t0
    row[name + "_maxerr"] = (out.float() - ref.float()).abs().max().item()
    if ks:
        reports = ksb.compile_reports()[n_reports:]
        row[name + "_report"] = [r.to_json() for r in reports]
        row[name + "_hits"] = sum(r.hits for r in reports)
        row[name + "_swapped"] = sum(r.swapped for r in reports)
        row[name + "_analysis_s"] = sum(r.analysis_s for r in reports)
        guards = [r.guard.to_json() for r in reports if r.guard is not None]
        if guards:
            row[name + "_guard"] = guards
    torch._dynamo.reset()
    captured: list = []
    t0 = time.time()
    cm = _compile(layer, mode, ks, db, captured)
    cm(*inputs)
    _sync()
    row[name + "_compile_warm_s"] = time.time() - t0
    row[name + "_dobench_ms"] = bench(lambda: cm(*inputs))
    if mode in CUDAGRAPH_MODES and torch.cuda.is_available():
        from ks_inductor.compiler.graph_guard import GuardConfig, interleaved_batches

        for _ in range(3):  # CUDA-graph trees record on the first calls
            cm(*inputs)
        samples = interleaved_batches({name: lambda: cm(*inputs)}, "cuda",
                                      GuardConfig(rounds=9, round_ms=40.0, budget_s=60.0))[name]
        row[name + "_seq_ms"] = statistics.median(x for r in samples for x in r)
    row[name + "_cudagraph_skips"] = dict(counters["inductor"]).get("cudagraph_skips", 0)
    return row, captured


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--budget", type=int, default=6, help="judgments per region while warming")
    ap.add_argument("--region-time", type=float, default=25.0, help="seconds per region while warming")
    ap.add_argument("--warm-time", type=float, default=210.0, help="seconds for all warming")
    ap.add_argument("--deadline", type=float, default=470.0, help="seconds for the whole run")
    ap.add_argument("--db", default=None, help="kernel cache (default: a fresh file in a temp dir)")
    ap.add_argument("--skip-warm", action="store_true", help="use --db as it is")
    ap.add_argument("--skip-max-autotune", action="store_true")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    ap.add_argument("--small", action="store_true", help="tiny dims and shapes (a CPU smoke run of this script)")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--kinds", default=None,
                    help="warm only regions whose name starts with one of these comma-separated prefixes "
                         "(attention,norm,matmul_bmm,...), in that order")
    args = ap.parse_args(argv)
    if args.small:
        global H, FF, NH, KV, D
        H, FF, NH, KV, D = 64, 128, 4, 2, 16
        PHASES.update({"decode_B16_ctx2048": (2, 1, 8), "prefill_T4096": (1, 8, 0)})

    if not args.small:
        os.environ.pop("TRITON_INTERPRET", None)
    tmp = tempfile.mkdtemp(prefix="ks-layer-")
    # A fresh Inductor cache: "cold" compile times are cold for every variant alike.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    import torch
    import triton

    clock = Clock(args.deadline)
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    dev, bf = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    db = args.db or os.path.join(tmp, "kernels.db")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "db": db, "args": vars(args), "phases": {},
    }
    layer = build_layer(dev, bf)
    phase_inputs = {n: make_inputs(*PHASES[n], dev, bf) for n in args.phases.split(",") if n in PHASES}
    try:
        from ks_inductor.judge.timing import measure_copy_bandwidth

        bw = measure_copy_bandwidth(dev) if on_gpu else float("nan")
        weights = sum(p.numel() * p.element_size() for p in layer.parameters())
        result["copy_bandwidth_Bps"] = bw
        for n, inp in phase_inputs.items():
            kv = inp[3].numel() * inp[3].element_size() * 2
            result.setdefault("memory_floor_ms", {})[n] = (weights + kv) / bw * 1e3
    except Exception as e:  # noqa: BLE001
        result["floor_error"] = str(e)
    if not args.skip_warm:
        try:
            result["warm"] = warm_layer(layer, phase_inputs, db, args.budget, args.region_time,
                                        min(args.warm_time, clock.left() - 200),
                                        args.kinds.split(",") if args.kinds else None)
        except Exception as e:  # noqa: BLE001
            result["warm_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    _write(args.out, result)
    variants = MAIN_VARIANTS + ([] if args.skip_max_autotune else AUTOTUNE_VARIANTS)
    if not args.skip_timing:
        for n, inp in phase_inputs.items():
            row = result["phases"].setdefault(n, {})
            time_variants(layer, inp, db, clock, variants, row)
            ratios(row)
            _write(args.out, result)
            short = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                     if not k.endswith("_report")}
            print(n, json.dumps(short), flush=True)
    result["wall_s"] = time.time() - clock.t0
    _write(args.out, result)
    return 0


def _write(path: str, result: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
