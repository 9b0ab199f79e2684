"""The red-team suite on a GPU: every exploit candidate through the judge as a search judges (one judge, many
candidates, each followed by an honest one) and as ``kernelsmith eval`` judges (a fresh judge per candidate).

    python -m benchmarks.gpu.redteam [--out PATH] [--eval-parallel 4] [--backend triton-cuda]

Every exploit must come back rejected (or quarantined, never served) and every honest candidate accepted. The
exploits of ``tests/candidates/exploits`` run with every rule on; those of ``tests/candidates/isolation`` with the
static rules off, so that what stops them is the isolation (the process boundary, the sandbox, the judge-side
allow-list, a fresh process per candidate). Exit code 0 when every verdict is as expected. The JSON goes to
``--out``, else ``$OUT/redteam.json`` when ``$OUT`` is set, else ``./redteam.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PROBLEM = ROOT / "tests" / "problems" / "rmsnorm.py"
HONEST = ROOT / "tests" / "candidates" / "rmsnorm_ok.py"
EXPLOITS = ROOT / "tests" / "candidates" / "exploits"
ISOLATION = ROOT / "tests" / "candidates" / "isolation"
# Exploits written against the launch-plan judge; judged with the static rules off, so that the plan is what stops
# them.
TRUSTED = ROOT / "tests" / "candidates" / "trusted"
# Trusted-set candidates whose trick buys nothing: accepted, and timed no faster than the honest kernel after them.
TRUSTED_NO_GAIN = {"forged_timing.py", "call_stack_partial.py", "lying_process.py", "device_cache.py", "host_hog.py"}
# Rejected where the sandbox keeps /dev/shm read-only (Landlock), accepted elsewhere: its stash is what is tested.
TRUSTED_EITHER = {"shm_stash_writer.py"}
# How much faster than the honest kernel a no-gain candidate may time (launch-bound noise on a loaded host).
NO_GAIN_SLACK = 0.87
# Candidates of the isolation set that are honest kernels (they rig the worker for the next candidate only).
ISOLATION_HONEST = {"polluter_allow_list.py", "polluter_forward_hook.py"}
# The exploit classes a red-team review of an earlier judge found accepted; they also go through ``eval``.
EVAL_EXPLOITS = ("alias_module_reach.py", "class_attr_cache.py", "content_cache_update.py", "global_forward_hook.py",
                 "judge_allowlist_rebind.py", "raw_thread.py", "overflow_zeros.py")
# Exploits made for other problems than the RMSNorm one: (problem, honest candidate) per file.
OTHER_PROBLEMS = {"overflow_zeros.py": ("huge_outputs.py", "huge_outputs_ok.py"),
                  "heavy_tail_zeros.py": ("heavy_tail.py", "heavy_tail_ok.py")}


def _row(r: Any) -> dict[str, Any]:
    return {"verdict": r.verdict, "stage": r.stage, "flags": r.flags, "reasons": [x[:240] for x in r.reasons[:3]],
            "candidate_ms": r.candidate_ms}


def _expected_ok(name: str, row: dict[str, Any], honest_ms: float | None = None) -> bool:
    if name in TRUSTED_EITHER:
        return True
    if name in TRUSTED_NO_GAIN:
        faster = (honest_ms is not None and row.get("candidate_ms") is not None
                  and row["candidate_ms"] < NO_GAIN_SLACK * honest_ms)
        return row["verdict"] in ("accepted", "rejected") and not faster
    honest = name.startswith("honest") or name in ISOLATION_HONEST
    return row["verdict"] == "accepted" if honest else row["verdict"] in ("rejected", "quarantined")


def _problem_for(name: str) -> tuple[Path, Path]:
    if name in OTHER_PROBLEMS:
        prob, ok = OTHER_PROBLEMS[name]
        return ROOT / "tests" / "problems" / prob, ROOT / "tests" / "candidates" / ok
    return PROBLEM, HONEST


def search_part(backend: str | None, limit: int | None = None, sink: Any = None) -> dict[str, Any]:
    """One judge per rule set, as a search uses it. The exploits go in all at once with an honest candidate after
    each (the judge's pool decides what runs when); the isolation set one after another, each followed by an
    honest one, since what it tests is what a candidate leaves for the next."""
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    out: dict[str, Any] = {}
    for label, folder, static, serial in (("exploits", EXPLOITS, True, False), ("isolation", ISOLATION, False, True),
                                          ("trusted", TRUSTED, False, False)):
        cfg = JudgeConfig.for_search(backend=backend, static_rules=static, compile_timeout_s=30, run_timeout_s=30)
        rows: dict[str, Any] = {}
        with Judge(cfg, max_workers=1 if serial else None) as judge:
            futures = {}
            for path in sorted(folder.glob("*.py"))[:limit]:
                prob_path, honest_path = _problem_for(path.name)
                problem = load_problem(prob_path)
                futures[path.name] = judge.submit(problem, path.read_text())
                if serial:
                    futures[path.name].result()
                futures[f"honest after {path.name}"] = judge.submit(problem, honest_path.read_text())
                if serial:
                    futures[f"honest after {path.name}"].result()
            rows = {k: _row(f.result()) for k, f in futures.items()}
        out[label] = rows
        if sink is not None:
            sink(out)
    return out


def eval_part(backend: str | None, parallel: int, names: list[Path]) -> dict[str, Any]:
    """``kernelsmith eval --json`` per candidate, a few at once (the device lock orders their timing)."""
    def one(path: Path) -> tuple[str, dict[str, Any]]:
        prob_path, _ = _problem_for(path.name)
        if path.parent in (ISOLATION, TRUSTED):
            # eval's own path (a one-shot judge in a fresh process) with the static rules off, which eval offers no
            # flag for.
            cmd = [sys.executable, "-m", "benchmarks.gpu.redteam", "--one-static-off", str(prob_path), str(path)]
        else:
            cmd = [sys.executable, "-m", "ks_inductor.cli", "eval", str(prob_path), str(path), "--json"]
        if backend:
            cmd += ["--backend", backend]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=400)
        try:
            data = json.loads(p.stdout)
            row = {"verdict": data.get("verdict"), "flags": data.get("flags"),
                   "reasons": [x[:240] for x in (data.get("reasons") or [])[:3]]}
        except json.JSONDecodeError:
            row = {"verdict": "no-json", "stderr": p.stderr[-800:]}
        row["exit"] = p.returncode
        row["wall_s"] = round(time.monotonic() - t0, 1)
        return path.name, row

    with ThreadPoolExecutor(parallel) as pool:
        return dict(pool.map(one, names))


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--backend", default=None, help="judge backend (default: detect)")
    p.add_argument("--eval-parallel", type=int, default=6)
    p.add_argument("--limit", type=int, default=None, help="candidates per folder (a quick check of the script)")
    p.add_argument("--one-static-off", nargs=2, metavar=("PROBLEM", "CANDIDATE"),
                   help="judge one candidate with a one-shot judge, static rules off; print the verdict's JSON")
    args = p.parse_args(argv)
    if args.one_static_off:
        from ks_inductor.judge import JudgeConfig
        from ks_inductor.judge.service import evaluate
        from ks_inductor.problem_tracing import load_problem

        prob, cand = args.one_static_off
        r = evaluate(load_problem(Path(prob)), Path(cand).read_text(),
                     JudgeConfig(backend=args.backend, static_rules=False))
        print(r.dumps())
        return 0 if r.accepted else 1
    out = Path(args.out or (Path(os.environ["OUT"]) / "redteam.json" if os.environ.get("OUT") else "redteam.json"))
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                              "torch": torch.__version__, "triton": triton.__version__}
    chosen = [EXPLOITS / n for n in EVAL_EXPLOITS if (EXPLOITS / n).exists()]
    chosen += [q for q in sorted(ISOLATION.glob("*.py")) if q.name not in ISOLATION_HONEST]
    chosen += [q for q in sorted(TRUSTED.glob("*.py")) if q.name not in TRUSTED_NO_GAIN | TRUSTED_EITHER]

    def save() -> None:
        out.write_text(json.dumps(report, indent=1, default=str))

    # The evals run beside the search part (the device lock orders their timing): each part's figures are saved
    # as soon as it ends, so a run cut short still leaves them.
    with ThreadPoolExecutor(1) as side:
        t0 = time.monotonic()

        def timed_evals() -> tuple[dict[str, Any], float]:
            rows = eval_part(args.backend, args.eval_parallel, chosen[:args.limit])
            return rows, round(time.monotonic() - t0, 1)  # its own end, whichever part ends first

        evals = side.submit(timed_evals)

        def partial(rows: dict[str, Any]) -> None:
            report["search"] = rows
            save()

        report["search"] = search_part(args.backend, args.limit, partial)
        report["search_s"] = round(time.monotonic() - t0, 1)
        save()
        report["eval"], report["eval_s"] = evals.result()
    wrong = [f"search/{label}/{k}" for label, rows in report["search"].items() for k, r in rows.items()
             if not _expected_ok(k, r, (rows.get(f"honest after {k}") or {}).get("candidate_ms"))]
    wrong += [f"eval/{k}" for k, r in report["eval"].items() if not _expected_ok(k, r)]
    report["unexpected"] = wrong
    save()
    for label, rows in report["search"].items():
        for k, r in rows.items():
            print(f"search {label:9s} {k:48s} {r['verdict']:11s} {','.join(r['flags'])}")
    for k, r in report["eval"].items():
        print(f"eval   {k:58s} {r['verdict']:11s} {','.join(r.get('flags') or [])} exit={r['exit']} {r['wall_s']}s")
    print("unexpected:", wrong or "none")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
