"""KernelBench problems on a GPU, the way a user runs them: ``kernelsmith evolve PROBLEM.py`` on each problem file
(the embedded mutator, the kernel cache in one SQLite file), then ``kernelsmith bench --suite kernelbench`` over the
same problems, which re-judges each stored kernel and times it against eager and Inductor at KernelBench's
tolerance. Both run as subprocesses of the CLI, so nothing here stands between the user's commands and the numbers.

    python benchmarks/gpu/kernelbench_h200.py KERNELBENCH_DIR LEVEL IDS TAG [--budget N] [--minutes M] [--parallel P]
        [--backend triton-interpret]   # the CPU check, at shrunken shapes

writes ``$OUT/kernelbench-evolve-TAG.json`` (per problem: the evolve summary, its wall time, its exit status) and
``$OUT/kernelbench-bench-TAG.json`` (the bench suite's result file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _cli(*args: str, timeout: float) -> tuple[int, str, str, float]:
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "ks_inductor.cli", *args], capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            "timed out", time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernelbench")
    ap.add_argument("level", type=int)
    ap.add_argument("ids")
    ap.add_argument("tag")
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--bench-timeout", type=float, default=240.0)
    ap.add_argument("--backend", default="triton-cuda")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", "/tmp"))
    db = f"sqlite:///{out / f'kernelbench-{a.tag}.db'}"
    folder = Path(a.kernelbench).expanduser()
    folder = folder / "KernelBench" if (folder / "KernelBench").is_dir() else folder
    files = {int(f.name.split("_")[0]): f for f in (folder / f"level{a.level}").glob("*.py")}
    ids = [int(i) for i in a.ids.split(",")]
    rows = []
    record = out / f"kernelbench-evolve-{a.tag}.json"
    for i in ids:
        f = files[i]
        rc, so, se, wall = _cli("evolve", str(f), "--backend", a.backend, "--budget", str(a.budget),
                                "--time-limit", str(a.minutes * 60), "--parallel", str(a.parallel), "--db", db, "--json",
                                timeout=a.minutes * 60 + 180)
        try:
            summary = json.loads(so.strip().splitlines()[-1]) if so.strip() else None
        except json.JSONDecodeError:
            summary = None
        if summary and isinstance(summary.get("best"), dict):
            summary["best"].pop("source", None)  # the kernel lives in the cache file
        rows.append({"level": a.level, "id": i, "file": f.name, "rc": rc, "wall_s": round(wall, 1),
                     "summary": summary, "stderr_tail": se[-1500:]})
        print(f"L{a.level} {f.name}: rc {rc}, {wall:.0f} s", flush=True)
        record.write_text(json.dumps({"rows": rows}, indent=1))
    rc, so, se, wall = _cli("bench", "--suite", "kernelbench", "--kernelbench", str(a.kernelbench), "--levels",
                            str(a.level), "--problems", a.ids, "--db", db, "--backend", a.backend,
                            "--out", str(out / f"kernelbench-bench-{a.tag}.json"), "--no-plots",
                            timeout=a.bench_timeout)
    print(so[-4000:], se[-3000:], flush=True)
    record.write_text(json.dumps({"rows": rows, "bench": {"rc": rc, "wall_s": round(wall, 1),
                                                          "stdout_tail": so[-6000:], "stderr_tail": se[-3000:]}},
                                 indent=1))


if __name__ == "__main__":
    main()
