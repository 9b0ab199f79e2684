"""Where a search judgment's time goes on a GPU, per stage, for one problem at its own size.

Judges the problem's seeds (the embedded mutator's, Inductor's kernel first) one after another, then the same
again four at a time, through a search's judge (``JudgeConfig.for_search``), and prints each judgment's stages
(``EvalResult.stage_s``) and the judgments a minute of each pass.

    python -m benchmarks.gpu.judge_stages ks_inductor/catalogue/problems/softmax_bf16.py --out $OUT/judge-stages.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import classify

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem")
    ap.add_argument("--seeds", type=int, default=4, help="seeds judged per pass")
    ap.add_argument("--parallel", type=int, default=4, help="judgments in flight in the second pass")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    problem = load_problem(args.problem)
    fm = classify(problem)
    if fm is not None:
        fm.target = "cuda"
    seeds = EmbeddedMutator(fm).seeds()[: args.seeds]
    if not seeds:
        ap.error(f"{args.problem}: no seed to judge (no op family matches it and Inductor made no kernel)")
    res: dict = {"problem": problem.name, "bytes_moved": problem.bytes_moved, "passes": {}}
    with Judge(JudgeConfig.for_search(backend="triton-cuda"), max_workers=args.parallel) as judge:
        t0 = time.monotonic()
        room = judge.room(problem)
        res["room_s"] = time.monotonic() - t0
        res["room"] = room.to_json() if room is not None else None
        for name, width in (("serial", 1), ("parallel", args.parallel)):
            rows = []
            t0 = time.monotonic()
            for i in range(0, len(seeds), width):
                futs = [judge.submit(problem, c.source) for c in seeds[i:i + width]]
                wait(futs)
                for c, f in zip(seeds[i:i + width], futs):
                    r = f.result()
                    rows.append({"template": c.template, "variant": c.variant, "verdict": r.verdict,
                                 "duration_s": r.duration_s, "stage_s": r.stage_s, "candidate_ms": r.candidate_ms})
                    print(f"[{name}] {c.template}/{c.variant} {r.verdict} {r.duration_s:.1f}s "
                          + " ".join(f"{k}={v:.1f}" for k, v in sorted(r.stage_s.items(), key=lambda kv: -kv[1])
                                     if v >= 0.1), flush=True)
            wall = time.monotonic() - t0
            res["passes"][name] = {"wall_s": wall, "per_minute": 60 * len(rows) / wall, "judgments": rows}
            print(f"[{name}] {len(rows)} judgments in {wall:.1f}s: {60 * len(rows) / wall:.1f} a minute", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
