"""Which KernelBench problems the embedded mutator can start from: for each problem file of a level, the op family
it matches and the template variants that render a seed for it. No GPU and no real tensors: problems are traced on
fake tensors, so KernelBench's multi-GiB shapes cost nothing here.

    python -m benchmarks.kernelbench_coverage KERNELBENCH_DIR LEVEL [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ks_inductor.evolve.families import classify
from ks_inductor.evolve.templates import templates_for
from ks_inductor.problem import problem_from_source


def survey(folder: Path, level: int) -> list[dict]:
    folder = folder / "KernelBench" if (folder / "KernelBench").is_dir() else folder
    files = sorted((folder / f"level{level}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
    rows = []
    for f in files:
        row: dict = {"problem": f.stem, "family": None, "seeds": [], "errors": []}
        try:
            p = problem_from_source(f.read_text(), f.stem)
        except Exception as e:  # noqa: BLE001 - a problem that does not load is reported, the survey goes on
            row["errors"].append(f"load: {type(e).__name__}: {str(e)[:160]}")
            rows.append(row)
            continue
        row["ops"] = p.op_summary
        fm = classify(p)
        if fm is not None:
            row["family"] = fm.family
            for t in templates_for(fm):
                for v in t.variants(fm):
                    try:
                        t.render(fm, t.default(fm, v, fm.target), v)
                        row["seeds"].append(f"{t.name}/{v}")
                    except Exception as e:  # noqa: BLE001
                        row["errors"].append(f"{t.name}/{v}: {type(e).__name__}: {str(e)[:160]}")
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernelbench", type=Path)
    ap.add_argument("level", type=int)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = survey(a.kernelbench.expanduser(), a.level)
    for r in rows:
        print(f"{r['problem'][:60]:60s} {str(r['family']):14s} {', '.join(r['seeds']) or '-'}"
              + (f"  [{'; '.join(r['errors'])}]" if r["errors"] else ""))
    seeded = sum(1 for r in rows if r["seeds"])
    print(f"level {a.level}: {seeded} of {len(rows)} problems get a seed")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
