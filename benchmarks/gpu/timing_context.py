"""Does a kernel's time depend on what runs around it? A diagnostic for compute-bound kernels on a power-limited GPU.

The same template configuration and the same peers are timed two ways: each tool's calls back to back (as
``sweep_templates.py`` does), and in the shuffled per-round blocks of the serving-ops harness (as
``evolve_serving_ops.py`` does). ``nvidia-smi`` samples the SM clock and the board power every 20 ms meanwhile,
so each timing comes with the clock and power it ran at.

    python benchmarks/gpu/timing_context.py $OUT/context.json --op gemm_gelu \\
        --config '{"variant": "matmul/tma", "params": {"WS": 1}}'
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.evolve_serving_ops import OPS, PROBLEM_DIR  # noqa: E402


class _Sampler:
    """SM clock (MHz) and board power (W) from ``nvidia-smi -lms``, with host timestamps."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                clock, power = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.rows.append((time.perf_counter(), clock, power))

    def between(self, t0: float, t1: float) -> dict[str, float | None]:
        sel = [(c, p) for t, c, p in self.rows if t0 <= t <= t1]
        if not sel:
            return {"sm_mhz": None, "power_w": None, "samples": 0}
        return {"sm_mhz": sum(c for c, _ in sel) / len(sel), "power_w": sum(p for _, p in sel) / len(sel),
                "samples": len(sel)}

    def close(self) -> None:
        self.proc.terminate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--op", default="gemm_gelu", choices=sorted(OPS))
    ap.add_argument("--config", action="append", default=[], help="JSON {variant, params}; repeatable")
    ap.add_argument("--calls", type=int, default=200, help="back-to-back calls per tool")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rep-ms", type=float, default=150.0)
    args = ap.parse_args()

    import torch
    import triton

    from benchmarks.gpu.sweep_templates import _candidate, _problem, _render
    from ks_inductor.judge import timing as T
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import classify, configured

    path = str(PROBLEM_DIR / OPS[args.op])
    fm = classify(load_problem(path))
    fm.target = "cuda"
    _, ref, inputs = _problem(path)
    compiled = torch.compile(ref)
    fns: dict[str, Any] = {"eager": lambda: ref(*inputs), "inductor": lambda: compiled(*inputs)}
    for i, raw in enumerate(args.config):
        row = json.loads(raw)
        t, v, params = configured(fm, row["variant"], row.get("params"))
        model = _candidate(path, _render(fm, t.name, v, params), f"/tmp/ks-context/{i}")
        fns[f"ks{i}:{v}:{json.dumps(row.get('params', {}), sort_keys=True)}"] = (lambda m=model: m(*inputs))
    flush = T.make_l2_flush("cuda")
    sampler = _Sampler()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "op": args.op, "alone": {}, "interleaved": {}}
    try:
        with torch.no_grad():
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            for name, fn in fns.items():
                t0 = time.perf_counter()
                s = T.benchmark_interleaved({name: fn}, rounds=1, warmup_ms=25.0, rep_ms=0.0, min_reps=args.calls,
                                            max_reps=args.calls, flush=flush)[name]
                res["alone"][name] = {"median_ms": T.summarize(s).median_ms,
                                      **sampler.between(t0, time.perf_counter())}
            t0 = time.perf_counter()
            s = T.benchmark_interleaved(fns, rounds=args.rounds, rep_ms=args.rep_ms, flush=flush)
            window = sampler.between(t0, time.perf_counter())
            res["interleaved"] = {name: {"median_ms": T.summarize(v).median_ms} for name, v in s.items()}
            res["interleaved_window"] = window
    finally:
        sampler.close()
    Path(args.out).write_text(json.dumps(res, indent=1))
    for mode in ("alone", "interleaved"):
        for name, r in res[mode].items():
            extra = f" at {r['sm_mhz']:.0f} MHz, {r['power_w']:.0f} W" if r.get("sm_mhz") else ""
            print(f"{mode:11s} {name:60s} {r['median_ms'] * 1e3:8.1f} us{extra}", flush=True)
    w = res["interleaved_window"]
    if w.get("sm_mhz"):
        print(f"interleaved window: {w['sm_mhz']:.0f} MHz, {w['power_w']:.0f} W", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
