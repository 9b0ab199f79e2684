"""Judged candidates per minute with the search protocol (``JudgeConfig.for_search``), and where their time goes.

    python -m benchmarks.judge_throughput [--n 24] [--backend triton-interpret] [--out PATH]

A small problem (RMSNorm by default) and one honest candidate, submitted ``--n`` times as distinct sources (a
comment apart, as an optimizer's children are) to one judge, all at once as a search with enough children in flight
would: the judge's pool decides what runs when. The reference is computed before the clock starts, as a search has
done by the time it judges children. Reported: candidates per minute (and per device-minute), each judgment's wall
time, and the per-stage split (``EvalResult.stage_s``) summed over the judgments. The JSON goes to ``--out``, else
to ``$OUT/judge_throughput.json`` when ``$OUT`` is set, else to stdout.

On a GPU host it measures the real protocol (timing, steady state); with ``--backend triton-interpret`` it measures
the interpreter judge on the CPU, where timing is a short re-check of rotated inputs rather than a measurement.

``--candidate seeds`` judges the embedded mutator's seed candidates for the problem instead of one file (each
template's variants and launch shapes, taken in turn until ``--n``): different kernels, as a search's first
generation is, for problems that have no hand-written candidate (``ks_inductor/catalogue/problems/*_bf16.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PROBLEM = ROOT / "tests" / "problems" / "rmsnorm.py"
DEFAULT_CANDIDATE = ROOT / "tests" / "candidates" / "rmsnorm_ok.py"


def seed_sources(problem: object, device: str) -> list[str]:
    """The embedded mutator's seeds for ``problem`` on ``device`` (templates only: Inductor's code generation is
    per problem and not the judge's work)."""
    from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
    from ks_inductor.seeds.families import classify

    fm = classify(problem)
    if fm is None:
        raise SystemExit(f"no op family matches {getattr(problem, 'name', problem)}: give a --candidate file")
    fm.target = device
    sources = [c.source for c in EmbeddedMutator(fm, inductor=False).seeds()]
    if not sources:
        raise SystemExit(f"no template renders a seed for {getattr(problem, 'name', problem)}")
    return sources


def measure(problem_path: Path, candidate_path: Path | str, n: int, backend: str | None, trials: int | None,
            workers: int | None, wall_s: float | None = None, save: Any = None) -> dict:
    """``wall_s`` bounds the timed part: judgments not finished by then are abandoned and the figures count those
    that finished. ``save(report)`` is called with what is known so far (after the reference and the first
    judgment, then at the end), so that a run killed from outside still leaves its first figures."""
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.verdict import DEADLINE_ERROR
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(problem_path)
    seeds = str(candidate_path) == "seeds"
    source = "" if seeds else Path(candidate_path).read_text()
    overrides = {"backend": backend}
    if trials:
        overrides["trials"] = trials
    config = JudgeConfig.for_search(**overrides)
    t_start = time.monotonic()
    with Judge(config, max_workers=workers) as judge:
        started_s = time.monotonic() - t_start
        pool = seed_sources(problem, judge.backend.device) if seeds else [source]
        first = judge.evaluate(problem, pool[0] + "\n# warm-up\n")  # computes and caches the reference
        devices = judge.device_count
        report = {"backend": judge.backend.name, "device": judge.fingerprint.device_name, "devices": devices,
                  "timed": judge.backend.timed, "judge_start_s": started_s,
                  "first_judgment": {"verdict": first.verdict, "duration_s": first.duration_s,
                                     "stage_s": first.stage_s, "reasons": first.reasons[:3]}}
        if save is not None:
            save(dict(report))
        t0 = time.monotonic()
        deadline = t0 + wall_s if wall_s else None  # unfinished judgments are killed then, not waited for
        futures = [judge.submit(problem, pool[i % len(pool)] + f"\n# child {i}\n", deadline=deadline)
                   for i in range(n)]
        done, _ = wait(futures, timeout=wall_s)
        wall = time.monotonic() - t0
        results = [r for r in (f.result() for f in futures if f in done) if r.error != DEADLINE_ERROR]
        for f in futures:
            f.cancel()
    if not results:
        report.update({"judged": 0, "submitted": n, "wall_s": wall, "per_minute": 0.0, "per_device_minute": 0.0})
        return report
    n_all, n = n, len(results)
    stages: dict[str, float] = {}
    for r in results:
        for k, v in r.stage_s.items():
            stages[k] = stages.get(k, 0.0) + v
    total = sum(stages.values())
    durations = [r.duration_s for r in results]
    report.update({
        "problem": problem_path.name, "candidate": "seeds" if seeds else Path(candidate_path).name,
        "distinct_sources": len(pool), "protocol": "search",
        "config": {"trials": config.trials, **config.protocol(final=False)},
        "judged": n, "submitted": n_all, "verdicts": {v: sum(r.verdict == v for r in results) for v in {r.verdict for r in results}},
        "wall_s": wall, "per_minute": 60.0 * n / wall, "per_device_minute": 60.0 * n / wall / max(1, devices),
        "judgment_s": {"mean": statistics.mean(durations), "median": statistics.median(durations),
                       "max": max(durations)},
        "stage_s_mean": {k: v / n for k, v in sorted(stages.items(), key=lambda kv: -kv[1])},
        "stage_share": {k: v / total for k, v in sorted(stages.items(), key=lambda kv: -kv[1])} if total else {},
        # Per judgment, how long it held the device shared (correctness) and alone (timing): the device's
        # throughput is bounded by the time it is held alone.
        "device_held_s_mean": {m: sum(r.device_held_s.get(m, 0.0) for r in results) / n
                               for m in sorted({m for r in results for m in r.device_held_s})},
        "reasons": sorted({r.reasons[0] for r in results if r.reasons})[:5],
    })
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", type=Path, default=DEFAULT_PROBLEM, help="KernelBench-format problem file")
    p.add_argument("--candidate", default=DEFAULT_CANDIDATE,
                   help="a correct candidate for it, or 'seeds': the embedded mutator's seed candidates")
    p.add_argument("--n", type=int, default=24, help="candidates judged (default 24)")
    p.add_argument("--backend", default=None, help="judge backend (default: detect)")
    p.add_argument("--trials", type=int, default=None, help="correctness trials (default: the judge's)")
    p.add_argument("--workers", type=int, default=None, help="judgments in flight (default: the judge's)")
    p.add_argument("--out", default=None, help="JSON output path (default $OUT/judge_throughput.json or stdout)")
    p.add_argument("--wall", type=float, default=None,
                   help="seconds for the timed part; judgments unfinished by then are left out (default: none)")
    args = p.parse_args(argv)
    out = args.out or (os.path.join(os.environ["OUT"], "judge_throughput.json") if os.environ.get("OUT") else None)

    def save(report: dict) -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(report, indent=2))

    report = measure(args.problem, args.candidate, args.n, args.backend, args.trials, args.workers, args.wall, save)
    if not report["judged"]:
        save(report)
        print(json.dumps(report, indent=2))
        return 1

    from rich.console import Console

    from ks_inductor.cli import stage_table

    console = Console(stderr=True)
    console.print(f"{report['judged']} candidates in {report['wall_s']:.1f} s on {report['device']} "
                  f"({report['backend']}, {report['devices']} device(s)): {report['per_minute']:.1f} per minute, "
                  f"{report['per_device_minute']:.1f} per device-minute; verdicts {report['verdicts']}")
    console.print(stage_table(report["stage_s_mean"], report["judgment_s"]["mean"],
                              title=f"mean judgment {report['judgment_s']['mean']:.2f} s, by stage"))
    text = json.dumps(report, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
        console.print(f"wrote {out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
