"""Regions' rooms on this machine: for each problem file, the judge's timing of eager and Inductor (the search
protocol, once per problem) against its floor (bytes at the copy rate and FLOPs at the matmul rate, measured beside
the baselines), and whether that settles it.

    python -m benchmarks.gpu.rooms PROBLEM.py [PROBLEM.py ...] [--out PATH]

Writes ``--out``, else ``$OUT/rooms.json`` where ``$OUT`` is set, else ``./rooms.json``: one row per problem with the
room (``ks_inductor.judge.room.Room.to_json()``), its one-line summary and the seconds it took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--backend", default=None)
    a = ap.parse_args()
    import torch

    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import problem_from_source

    rows = []
    with Judge(JudgeConfig.for_search(backend=a.backend)) as judge:
        for f in a.problems:
            p = problem_from_source(f.read_text(), name=f.stem)
            t0 = time.monotonic()
            room = judge.room(p)
            rows.append({"problem": f.name, "s": round(time.monotonic() - t0, 1), **room.to_json(),
                         "summary": room.summary()})
            print(json.dumps({"problem": f.name, "summary": room.summary()}), flush=True)
    out = a.out or Path(os.environ.get("OUT", "."), "rooms.json")
    out.write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                               "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
