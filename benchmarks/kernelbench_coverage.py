"""Which KernelBench problems the embedded mutator can start from: for each problem file of a level, the op family
it matches, the template variants that render a seed for it, and the variants of Inductor's own code that render
one (generated for an sm_90 device; on a host without a GPU, a stand-in one), or why Inductor's code gives none. No
GPU and no real tensors: problems are traced on fake tensors, so KernelBench's multi-GiB shapes cost nothing here.

    python -m benchmarks.kernelbench_coverage KERNELBENCH_DIR LEVEL [--json OUT.json] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import INDUCTOR, classify, generic_match, templates_for

# Tracing (make_fx, fake tensors) is not thread-safe: one problem is traced at a time, while Inductor's code
# generation, each in a process of its own, runs for several.
_TRACE = threading.Lock()


def survey_one(f: Path) -> dict:
    with _TRACE:
        row, fm = _templates(f)
    if fm is None:
        return row
    INDUCTOR.variants(fm)  # Inductor's code generation, outside the lock
    with _TRACE:
        for v in INDUCTOR.variants(fm):
            try:
                INDUCTOR.render(fm, INDUCTOR.default(fm, v, fm.target), v)
                row["inductor"].append(v)
            except Exception as e:  # noqa: BLE001
                row["errors"].append(f"inductor/{v}: {type(e).__name__}: {str(e)[:160]}")
        row["inductor_missing"] = INDUCTOR.unavailable(fm)
    return row


def _templates(f: Path) -> tuple[dict, Any]:
    """The row with the templates' seeds, and the match Inductor's seeds are rendered for (None: no problem)."""
    row: dict = {"problem": f.stem, "family": None, "seeds": [], "inductor": [], "inductor_missing": {}, "errors": []}
    try:
        p = problem_from_source(f.read_text(), f.stem)
    except Exception as e:  # noqa: BLE001 - a problem that does not load is reported, the survey goes on
        row["errors"].append(f"load: {type(e).__name__}: {str(e)[:160]}")
        return row, None
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
    return row, fm or generic_match(p)


def survey(folder: Path, level: int, workers: int = 1) -> list[dict]:
    folder = folder / "KernelBench" if (folder / "KernelBench").is_dir() else folder
    files = sorted((folder / f"level{level}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
    # Inductor's code is generated in a process of its own per problem: threads keep several in flight.
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(survey_one, files))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernelbench", type=Path)
    ap.add_argument("level", type=int)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workers", type=int, default=2, help="problems surveyed at once")
    a = ap.parse_args()
    rows = survey(a.kernelbench.expanduser(), a.level, a.workers)
    for r in rows:
        why = "; ".join(sorted(set(r["inductor_missing"].values())))[:120] if not r["inductor"] else ""
        print(f"{r['problem'][:50]:50s} {str(r['family']):14s} {', '.join(r['seeds']) or '-'} | inductor: "
              f"{', '.join(r['inductor']) or '-'}" + (f" ({why})" if why else "")
              + (f"  [{'; '.join(r['errors'])}]" if r["errors"] else ""))
    templates = sum(1 for r in rows if r["seeds"])
    inductor = sum(1 for r in rows if r["inductor"])
    either = sum(1 for r in rows if r["seeds"] or r["inductor"])
    print(f"level {a.level}: {either} of {len(rows)} problems get a seed ({templates} from the templates, "
          f"{inductor} from Inductor's code)")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
