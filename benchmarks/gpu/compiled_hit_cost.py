"""What a cache hit costs per call in a compiled graph, for each way the backend runs it.

A bf16 ``NormResidual`` (``--rows`` x ``--hidden``) is warmed into a fresh cache, with no room settling it (Inductor
runs a norm near its floor, where a warm would otherwise not search) and against eager alone: what is timed is the
cost of serving a hit, so the cache needs one, and a norm's kernel rarely clears the margin against Inductor at
this size. A warm that finds none ends the run (exit 1) rather than timing two Inductor graphs. Then, each in a fresh process and
``--repeats`` times, the model is compiled twice, by Inductor alone and by kernelsmith serving the hit (graph guard
off, any speedup), and the two are timed in interleaved rounds of back-to-back calls on the same inputs:

* ``triton_op``: the kernel's judged plan traced into the graph Inductor compiles (Inductor launches the kernel from
  its own wrapper);
* ``custom_op``: the same kernel as an opaque op that runs the judged plan per call (``kernelsmith.triton_op``
  off), which is what a kernel whose plan cannot be traced gets.

Each process reports µs per call of both, their ratio, how the region was launched (the compile report's
``launch``) and the largest difference from Inductor's outputs. The result is the spread of each variant's ratio.

    python -m benchmarks.gpu.compiled_hit_cost --out $OUT/compiled-hit-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results import spread  # noqa: E402 - importable once the checkout is on the path

VARIANTS = {"triton_op": True, "custom_op": False}


def _model(rows: int, hidden: int, device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from ks_inductor.catalogue.models import NormResidual

    # bf16 on a GPU; float32 on the CPU, where the interpreter's kernels are for a check of this script only.
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = NormResidual(hidden).to(device=device, dtype=dtype).eval()
    inputs = tuple(torch.randn(rows, hidden, device=device, dtype=dtype) for _ in range(2))
    return model, inputs


def warm_cache(db: str, rows: int, hidden: int, budget: int, time_limit_s: float, device: str) -> dict[str, Any]:
    """Warm the model's regions into ``db``: how many got a kernel."""
    import math

    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import problems_from_model, warm

    model, inputs = _model(rows, hidden, device)
    with KernelStore(db) as store:
        summary = warm(problems_from_model(model, inputs, db=db), store,
                       EvolveConfig(budget=budget, time_limit_s=time_limit_s, final_candidates=0, settle_at=math.inf,
                                    baselines=("eager",)))
    return {"found": summary.found, "regions": len(summary.items)}


def time_variant(db: str, variant: str, rows: int, hidden: int, rounds: int, calls: int,
                 device: str) -> dict[str, Any]:
    """One process's figures for ``variant``: Inductor and kernelsmith compiled side by side, timed interleaved."""
    import torch

    from ks_inductor.compiler import backend as B

    model, inputs = _model(rows, hidden, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    served = torch.compile(model, backend="kernelsmith", options={
        "kernelsmith.db": db, "kernelsmith.graph_guard": "off", "kernelsmith.min_speedup": 0.0,
        "kernelsmith.triton_op": VARIANTS[variant]})
    inductor = torch.compile(model)

    def per_call_us(fn: Any) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        sync()
        return (time.perf_counter() - t0) / calls * 1e6

    with torch.no_grad():
        got, want = served(*inputs), inductor(*inputs)
        report = B.compile_reports()[-1]
        for fn in (served, inductor):
            per_call_us(fn)
        ours: list[float] = []
        theirs: list[float] = []
        for r in range(rounds):
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                (ours if side == 0 else theirs).append(per_call_us(served if side == 0 else inductor))
    return {"variant": report.variant, "launch": [r.launch for r in report.regions if r.launch],
            "swapped": report.swapped, "served_us": statistics.median(ours), "inductor_us": statistics.median(theirs),
            "ratio": statistics.median(t / o for t, o in zip(theirs, ours)),
            "max_abs_diff": max((a.float() - b.float()).abs().max().item() for a, b in zip(got, want))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--budget", type=int, default=6)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--db", default=None, help="a cache already warmed for the model (skips the warm)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: the Triton interpreter, a check that the script runs (its times mean nothing)")
    p.add_argument("--one", choices=sorted(VARIANTS), default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(time_variant(args.db, args.one, args.rows, args.hidden, args.rounds, args.calls,
                                      args.device)))
        return 0

    import torch
    import triton

    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                              "torch": torch.__version__,
                              "triton": triton.__version__, "args": vars(args)}
    db = args.db or str(Path(tempfile.mkdtemp(prefix="ks-hit-cost-")) / "k.db")
    if args.db is None:
        result["warm"] = warm_cache(db, args.rows, args.hidden, args.budget, args.time_limit, args.device)
        if not result["warm"]["found"]:
            print("compiled_hit_cost: the warm stored no kernel, so there is no hit to time; raise --budget or "
                  "--time-limit", file=sys.stderr)
            return 1
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:  # interleaved, so that a host's drift falls on both
            cmd = [sys.executable, "-m", "benchmarks.gpu.compiled_hit_cost", "--one", variant, "--db", db,
                   "--rows", str(args.rows), "--hidden", str(args.hidden), "--rounds", str(args.rounds),
                   "--calls", str(args.calls), "--device", args.device]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                runs[variant].append({"error": done.stderr.strip().splitlines()[-1:] or ["exit " + str(done.returncode)]})
                continue
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    result["runs"] = runs
    # a process whose graph swapped nothing timed Inductor against itself: not a hit's cost
    result["ratio_to_inductor"] = {v: spread([r.get("ratio") for r in rs if r.get("swapped")])
                                   for v, rs in runs.items()}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps(result["ratio_to_inductor"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
