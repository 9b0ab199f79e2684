"""Whether a launch-bound op gets the same verdict run after run on a loaded host.

Two decode-step ops as transformers runs them in a Llama-style model (batch 16, hidden 2048, 16 query heads over 8
key/value heads, head dim 128): the RMSNorm of ``bf16[16, 1, 2048]`` and the attention of one query row over 129
cached positions. Each takes microseconds on the device, and tens of microseconds to launch from Python.

While ``--load`` processes keep the host's cores busy (as a pack build's compiles do):

* **per call, in this process**: eager against the ops' first family seed, ``--repeats`` times, with the timing
  loop as the judge runs it (each timed call checked for a host that fell behind the GPU, and timed again behind a
  longer spin) and with that check off (``timing.CHECK_HOST = False``: the spin of 100 us alone);
* **the judge**: ``--repeats`` final judgments of the same seed, each by a fresh judge (its baselines timed anew),
  with the verdict, the ratios per call and in a CUDA graph, and how often calls were timed again.

The spread (min, median, max) of each ratio is the result.

    python -m benchmarks.gpu.small_op_stability --out $OUT/small-op-stability.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results import spread  # noqa: E402 - importable once the checkout is on the path

RMSNORM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(2048, dtype=torch.bfloat16))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * xf.to(torch.bfloat16)


def get_inputs():
    return [torch.randn(16, 1, 2048, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''

ATTENTION = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def get_inputs():
    bf = torch.bfloat16
    return [torch.randn(16, 16, 1, 128, dtype=bf), torch.randn(16, 8, 129, 128, dtype=bf),
            torch.randn(16, 8, 129, 128, dtype=bf)]


def get_init_inputs():
    return []
'''

OPS = {"decode_rmsnorm": RMSNORM, "decode_attention": ATTENTION}


def _seed(problem: Any) -> Any:
    from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
    from ks_inductor.seeds.families import classify

    fm = classify(problem)
    if fm is None:
        raise SystemExit(f"{problem.name}: no op family matches")
    fm.target = "cuda"
    seeds = EmbeddedMutator(fm).seeds()
    family = [s for s in seeds if s.template != "inductor"]
    return (family or seeds)[0]


def _module(source: str) -> Any:
    """The seed's module, from a file (Triton reads a kernel's source from where it was defined)."""
    import importlib.util
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ks-stability-")) / "seed_module.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("seed_module", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _in_process(source: str, problem_source: str, repeats: int) -> dict[str, Any]:
    """Eager against the seed's module, per call, with the host check on and off, ``repeats`` times each."""
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge import timing as T

    mod = exec_problem_source(problem_source, "<problem>")
    torch.manual_seed(0)
    ref = mod.Model(*mod.get_init_inputs()).cuda()
    cand = _module(source).ModelNew(*mod.get_init_inputs()).cuda()
    cand.load_state_dict(ref.state_dict(), strict=False)
    inputs = [x.cuda() for x in mod.get_inputs()]
    fns = {"eager": lambda: ref(*inputs), "candidate": lambda: cand(*inputs)}
    out: dict[str, Any] = {}
    for label, check in (("checked", True), ("unchecked", False)):
        T.CHECK_HOST = check
        ratios, eager_us, cand_us, retimed = [], [], [], []
        try:
            with torch.no_grad():
                for i in range(repeats):
                    leads: dict[str, Any] = {}
                    s = T.benchmark_interleaved(fns, rounds=7, rep_ms=200, seed=i, leads=leads)
                    e, c = (T.summarize(s[k]).median_ms for k in ("eager", "candidate"))
                    ratios.append(e / c)
                    eager_us.append(e * 1e3)
                    cand_us.append(c * 1e3)
                    retimed.append({k: v.report() for k, v in leads.items()})
        finally:
            T.CHECK_HOST = True
        out[label] = {"ratio": spread(ratios), "ratios": ratios, "eager_us": eager_us, "candidate_us": cand_us,
                      "leads": retimed}
    return out


def _judged(problem: Any, source: str, repeats: int) -> dict[str, Any]:
    from ks_inductor.judge import Judge, JudgeConfig

    rows = []
    for _ in range(repeats):
        with Judge(JudgeConfig(backend="triton-cuda")) as judge:
            r = judge.evaluate(problem, source, final=True)
        rows.append({"verdict": r.verdict, "correct": r.correct, "faster": r.faster, "launch_bound": r.launch_bound,
                     "served_by_race": r.served_by_race, "speedup_eager": r.speedup_eager,
                     "speedup_eager_lcb": r.speedup_eager_lcb, "speedup_inductor": r.speedup_inductor,
                     "steady_speedups": r.steady_speedups, "steady_speedup_lcbs": r.steady_speedup_lcbs,
                     "speedup_inductor_lcb": r.speedup_inductor_lcb, "not_faster": r.not_faster,
                     "candidate_us": (r.candidate_ms or 0) * 1e3,
                     "eager_us": r.timings["eager"].median_ms * 1e3 if "eager" in r.timings else None,
                     "leads": r.timing_leads, "notes": r.notes[:4], "reasons": r.reasons[:2]})
        print(f"  judged: {r.verdict} eager {r.speedup_eager} (lcb {r.speedup_eager_lcb}) inductor "
              f"{r.speedup_inductor} graph {r.steady_speedups} launch_bound {r.launch_bound}", flush=True)
    return {"rows": rows, "speedup_eager": spread([r["speedup_eager"] for r in rows]),
            "speedup_inductor": spread([r["speedup_inductor"] for r in rows]),
            "verdicts": sorted({r["verdict"] for r in rows})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 4, help="busy processes on the host meanwhile")
    ap.add_argument("--skip-judge", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import triton

    from ks_inductor.problem_tracing import problem_from_source

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "load_processes": args.load, "cpus": os.cpu_count(),
                           "command": "python -m benchmarks.gpu.small_op_stability " + " ".join(sys.argv[1:]),
                           "ops": {}}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        time.sleep(1.0)
        res["loadavg_at_start"] = os.getloadavg()
        for op in [o for o in args.ops.split(",") if o]:
            problem = problem_from_source(OPS[op], op)
            seed = _seed(problem)
            row: dict[str, Any] = {"seed": f"{seed.template}/{seed.variant}", "inputs": problem.signature()}
            res["ops"][op] = row
            print(f"[{op}] {row['seed']}", flush=True)
            row["per_call"] = _in_process(seed.source, OPS[op], args.repeats)
            for label in ("checked", "unchecked"):
                print(f"  per call, {label}: eager/candidate {row['per_call'][label]['ratio']}", flush=True)
            if not args.skip_judge:
                row["judge"] = _judged(problem, seed.source, args.repeats)
            Path(args.out).write_text(json.dumps(res, indent=1, default=str))
        res["loadavg_at_end"] = os.getloadavg()
    finally:
        for h in hogs:
            h.kill()
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
