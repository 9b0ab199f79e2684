"""The judge's own figures on a GPU: exploit verdicts, timing stability, throughput, and RMSNorm bf16 4096x4096.

    python -m benchmarks.gpu.judge_h200 OUT.json

Everything runs through the real judge (worker processes, reference isolation, interleaved timing).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "tests" / "problems"
CANDIDATES = ROOT / "tests" / "candidates"
EXPLOITS = CANDIDATES / "exploits"


def _row(r) -> dict:
    return {"verdict": r.verdict, "stage": r.stage, "flags": r.flags, "reasons": r.reasons[:3],
            "candidate_ms": r.candidate_ms, "speedup_eager": r.speedup_eager}


def _variants(source: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        warps = (1, 2, 4, 8, 16)[i % 5]
        launch = f"BLOCK=triton.next_power_of_2(n), num_warps={warps})"
        out.append(source.replace("BLOCK=triton.next_power_of_2(n))", launch) + f"\n# variant {i}\n")
    return out


def main(out_path: str) -> None:
    import torch
    import triton

    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    small = load_problem(PROBLEMS / "rmsnorm.py")
    big = load_problem(PROBLEMS / "rmsnorm_bf16.py")
    honest = (CANDIDATES / "rmsnorm_ok.py").read_text()

    # 1. The exploit suite, every rule on.
    t0 = time.time()
    cfg = JudgeConfig(rounds=3, rep_ms=60, compile_timeout_s=45, run_timeout_s=45)
    with Judge(cfg) as judge:
        report["fingerprint"] = judge.fingerprint.to_json()
        futures = {p.name: judge.submit(small, p.read_text()) for p in sorted(EXPLOITS.glob("*.py"))}
        futures["honest"] = judge.submit(small, honest)
        report["exploits"] = {k: _row(f.result()) for k, f in futures.items()}
    # Runtime guards alone (static rules off), including the side stream at a size where it matters.
    with Judge(JudgeConfig(rounds=3, rep_ms=60, static_rules=False, compile_timeout_s=45)) as judge:
        rt = {name: judge.submit(small, (EXPLOITS / name).read_text())
              for name in ("torch_compute_direct.py", "runtime_timer_patch.py", "global_flag.py", "kills_process.py")}
        rt["side_stream.py@bf16-4096"] = judge.submit(big, (EXPLOITS / "side_stream.py").read_text())
        report["exploits_static_off"] = {k: _row(f.result()) for k, f in rt.items()}
    report["exploit_suite_s"] = time.time() - t0

    # 2. One kernel judged 10 times (timing stability), and 10 distinct candidates (throughput), with the pool.
    with Judge(JudgeConfig()) as judge:
        judge.evaluate(big, honest)  # reference outputs and Inductor's cache warm
        t0 = time.time()
        same = [f.result() for f in [judge.submit(big, honest) for _ in range(10)]]
        t_same = time.time() - t0
        t0 = time.time()
        distinct = [f.result() for f in [judge.submit(big, s) for s in _variants(honest, 8)]]
        t_distinct = time.time() - t0
    meds = [r.candidate_ms for r in same if r.candidate_ms]
    report["repeat_10"] = {
        "candidate_ms": meds,
        "cv": statistics.pstdev(meds) / statistics.mean(meds) if meds else None,
        "eager_ms": [r.timings["eager"].median_ms for r in same if "eager" in r.timings],
        "inductor_ms": [r.timings["inductor"].median_ms for r in same if "inductor" in r.timings],
        "verdicts": [r.verdict for r in same],
        "wall_s": t_same,
        "judged_per_minute": 60 * len(same) / t_same,
    }
    report["distinct_10"] = {
        "rows": [_row(r) for r in distinct], "wall_s": t_distinct,
        "judged_per_minute": 60 * len(distinct) / t_distinct,
    }
    best = min((r for r in same if r.correct), key=lambda r: r.candidate_ms or 1e9, default=None)
    if best is not None:
        report["rmsnorm_bf16_4096x4096"] = {
            "candidate_ms": best.candidate_ms,
            "eager_ms": best.timings["eager"].median_ms,
            "inductor_ms": best.timings["inductor"].median_ms,
            "speedup_eager": best.speedup_eager, "speedup_inductor": best.speedup_inductor,
            "speedup_inductor_lcb": best.speedup_inductor_lcb,
            "roofline_fraction": best.roofline_fraction, "roofline_floor_ms": best.roofline_floor_ms,
            "anchors": {"eager_ms": 0.2432, "inductor_ms": 0.0477, "F.rms_norm_ms": 0.0260, "floor_ms": 0.0159},
        }
    Path(out_path).write_text(json.dumps(report, indent=1, default=str))
    for k, v in report["exploits"].items():
        print(f"{k:32s} {v['verdict']:12s} {','.join(v['flags'])}")
    for k, v in report["exploits_static_off"].items():
        print(f"[static off] {k:32s} {v['verdict']:12s} {','.join(v['flags'])}")
    print(json.dumps({k: report[k] for k in ("repeat_10", "rmsnorm_bf16_4096x4096") if k in report}, indent=1,
                     default=str)[:3000])
    print("distinct judged/min", report["distinct_10"]["judged_per_minute"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "judge_h200.json")
