"""Where a ``kernelsmith warm`` region's wall time goes, outside and inside the judge's judgments.

Runs ``kernelsmith warm`` in this process (its arguments after ``--``) with light wrappers around the stages it
passes through, each wrapper noting start and end per region (the region is known by the thread that searches it),
then prints one row per region and writes the events as JSON:

- ``wall``: the region's search, from :func:`ks_inductor.warm.region.evolve_region`'s call to its return;
- ``to_first``: from that call to the region's first judgment submitted (setup and seeding);
- ``seeds``: the search's setup and seeding (``Evolver.__init__``, which picks the seed templates, and the embedded
  mutator's ``seeds()``), of which ``inductor_gen`` is the region's wait for Inductor's code generation (a
  subprocess, perhaps started in the background before the region) and ``templates`` the rest;
- ``judging``: from the first search judgment submitted to the last search verdict; ``judge_sum`` the judgments'
  own durations (``EvalResult.duration_s``) and ``reference`` their ``reference`` stage (the reference's run, once
  per problem);
- ``reserve_idle``: from the last search verdict to the final judgments' start (time kept for them, unused);
- ``final``: the final protocol's judgments; ``n``/``nf``: search and final judgments.

The run's own ``discovery`` (tracing the model into regions) and ``judge_start`` are printed above the table.

    python benchmarks/warm_stages.py --out /tmp/stages.json -- --hf-config llama --hf-set hidden_size=64 ... \
        --backend triton-interpret --db sqlite:///tmp/w.db --json
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("warm_stages")
_local = threading.local()
_events: list[dict[str, Any]] = []
_lock = threading.Lock()
T0 = time.monotonic()


def _note(region: str | None, stage: str, start: float, end: float, **extra: Any) -> None:
    with _lock:
        _events.append({"region": region, "stage": stage, "start": start - T0, "end": end - T0, **extra})


def _region() -> str | None:
    return getattr(_local, "region", None)


def _timed(owner: Any, name: str, stage: str, sets_region: bool = False) -> None:
    """Wrap ``owner.name`` so that each call is noted as ``stage`` of the calling thread's region."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sets_region:
            problem = args[0]
            _local.region = f"{problem.name}:{problem.key[:6]}"
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _note(_region(), stage, start, time.monotonic())

    setattr(owner, name, wrapper)


def _wrap_submit(judge_cls: Any) -> None:
    """Note each judgment from its submission to its verdict, with the verdict's own duration and stages."""
    fn = judge_cls.submit

    @functools.wraps(fn)
    def submit(self: Any, problem: Problem, source: str, *args: Any, **kwargs: Any) -> Any:
        region, start, final = _region(), time.monotonic(), bool(kwargs.get("final"))
        fut = fn(self, problem, source, *args, **kwargs)

        def done(f: Any) -> None:
            extra: dict[str, Any] = {}
            if not f.cancelled() and f.exception() is None:
                res = f.result()
                extra = {"duration_s": res.duration_s, "stage_s": dict(res.stage_s or {}), "verdict": res.verdict}
            _note(region, "final_judgment" if final else "judgment", start, time.monotonic(), **extra)

        fut.add_done_callback(done)
        return fut

    judge_cls.submit = submit


def install() -> None:
    import ks_inductor.evolve.mutators.embedded as embedded
    import ks_inductor.seeds.families.inductor as fam_inductor
    import ks_inductor.seeds.inductor.generate as generate
    import ks_inductor.warm as warm_pkg
    import ks_inductor.warm.region as region
    import ks_inductor.warm.run as warm_run
    from ks_inductor.evolve import evolver
    from ks_inductor.judge.service import Judge

    _timed(warm_pkg, "problems_from_model", "discovery")
    _timed(evolver, "search_judge", "judge_start")
    _timed(region, "evolve_region", "region", sets_region=True)
    _timed(warm_run, "evolve_region", "region", sets_region=True)  # the sequential loop's own binding
    _timed(embedded.EmbeddedMutator, "seeds", "seeds")
    _timed(evolver.Evolver, "__init__", "seeds")
    _timed(generate, "_generate", "codegen_process")
    _timed(fam_inductor, "inductor_programs", "inductor_gen")
    _timed(evolver.Evolver, "_final_judgment", "final")
    _wrap_submit(Judge)


def table(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["region"] is not None:
            by[e["region"]].append(e)
    rows = []
    for name, evs in by.items():
        def span(stage: str, evs: list[dict[str, Any]] = evs) -> float:
            return sum(e["end"] - e["start"] for e in evs if e["stage"] == stage)

        region = next((e for e in evs if e["stage"] == "region"), None)
        if region is None:
            continue
        judg = [e for e in evs if e["stage"] == "judgment"]
        fin = [e for e in evs if e["stage"] == "final_judgment"]
        fstart = min((e["start"] for e in evs if e["stage"] == "final"), default=None)
        first = min((e["start"] for e in judg), default=None)
        last = max((e["end"] for e in judg), default=None)
        rows.append({
            "region": name, "start": region["start"], "wall": region["end"] - region["start"],
            "to_first": (first if first is not None else region["end"]) - region["start"],
            "seeds": span("seeds"), "inductor_gen": span("inductor_gen"),
            "templates": span("seeds") - span("inductor_gen"),
            "judging": (last - first) if judg else 0.0,
            "judge_sum": sum(e.get("duration_s") or 0.0 for e in judg),
            "reference": sum((e.get("stage_s") or {}).get("reference", 0.0) for e in judg + fin),
            "reserve_idle": (fstart - last) if fstart is not None and last is not None else 0.0,
            "final": span("final"), "n": len(judg), "nf": len(fin),
        })
    return sorted(rows, key=lambda r: r["start"])


def show(rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> str:
    cols = ("start", "wall", "to_first", "seeds", "inductor_gen", "templates", "judging", "judge_sum", "reference",
            "reserve_idle", "final", "n", "nf")
    run = {s: sum(e["end"] - e["start"] for e in events if e["stage"] == s)
           for s in ("discovery", "judge_start", "codegen_process")}
    lines = [", ".join(f"{k} {v:.1f} s" for k, v in run.items()),
             "| region | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        cells = [str(r[c]) if c in ("n", "nf") else f"{r[c]:.1f}" for c in cols]
        lines.append(f"| {r['region']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, warm_args = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="warm_stages.json", help="JSON of the rows and the raw events")
    args = p.parse_args(ours)
    install()
    from ks_inductor.cli import main as cli_main

    t = time.monotonic()
    try:
        rc = cli_main(["warm", *warm_args])
    except SystemExit as e:
        rc = int(e.code or 0)
    wall = time.monotonic() - t
    rows = table(_events)
    Path(args.out).write_text(json.dumps({"wall_s": wall, "rows": rows, "events": _events}, indent=1) + "\n")
    print(f"warm wall {wall:.1f} s\n" + show(rows, _events), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
