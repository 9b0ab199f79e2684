"""The kernelbench suite: KernelBench problems read in place from a checkout given by path.

Per problem: the cached kernelsmith kernel is re-judged here (the judge's correctness trials), then it and the
peers (eager and Inductor by default) are checked against the fp32 reference at KernelBench's tolerance
(atol = rtol = 1e-2) and timed together. The summary gives fast_p against eager and against Inductor for
p in 1.0, 1.05, 1.5, 2 with n = all problems (no kernel, or a wrong one, fails), and geometric-mean speedups.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

from benchmarks.config import BenchUsageError
from benchmarks.fastp import geomean, summarize_speedups
from benchmarks.measure import measure_problem, setup_problem
from benchmarks.peers import EAGER, INDUCTOR, NOTES, peers_for
from benchmarks.results import FAILED, KERNELSMITH, RunResult, ToolResult, WorkloadResult
from benchmarks.suites import SuiteContext, release_device

log = logging.getLogger(__name__)

KERNELBENCH_TOLERANCE = (1e-2, 1e-2)
_FILE = re.compile(r"^(\d+)_(.+)\.py$")


def levels_root(path: Path) -> Path:
    """The folder holding ``level1/``, ``level2/``...: the checkout's ``KernelBench/`` or the path itself."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise BenchUsageError(f"--kernelbench {path}: no such folder (give the path of a KernelBench checkout)")
    for cand in (path / "KernelBench", path):
        if any((cand / f"level{n}").is_dir() for n in range(1, 5)):
            return cand
    raise BenchUsageError(f"--kernelbench {path}: found no level1/ .. level4/ folders in it or in its KernelBench/")


def discover(path: Path, levels: list[int] | None = None, ids: list[int] | None = None,
             limit: int | None = None) -> list[tuple[int, int, Path]]:
    """(level, problem id, file) sorted by level then id. Level 4 (Hugging Face models that download weights)
    is only included when asked for."""
    root = levels_root(path)
    out = []
    for level in levels or [1, 2, 3]:
        folder = root / f"level{level}"
        if not folder.is_dir():
            raise BenchUsageError(f"{folder}: no such level folder")
        for f in folder.iterdir():
            m = _FILE.match(f.name)
            if m and (not ids or int(m.group(1)) in ids):
                out.append((level, int(m.group(1)), f))
    out.sort(key=lambda t: (t[0], t[1]))
    return out[:limit] if limit else out


def _dtype_of(problem: Problem) -> str:
    floats = [s.dtype for s in problem.input_specs if s.kind == "tensor" and s.dtype and "float" in s.dtype]
    return floats[0] if floats else "float32"


def _judge_kernel(ctx: SuiteContext, problem: Problem, source: str) -> tuple[str | None, dict[str, Any]]:
    """(reason it is rejected or None, what the judge said)."""
    res = ctx.kernels.judge().evaluate(problem, source, timing=False)
    info = {"verdict": res.verdict, "stage": res.stage, "trials": res.trials, "flags": res.flags,
            "reasons": res.reasons[:5], "error": res.error}
    if res.accepted:
        return None, info
    why = "; ".join(res.reasons[:3]) or res.error or res.verdict
    return f"{res.verdict}: {why}", info


def plan(cfg) -> list[tuple[int, int, Path]]:  # noqa: ANN001 - RunConfig
    files = discover(cfg.kernelbench, cfg.levels, cfg.problem_ids, cfg.limit)
    if not files:
        raise BenchUsageError("no KernelBench problems match the --levels/--problems filters")
    return files


def run(ctx: SuiteContext) -> None:
    from ks_core.problem_record import ProblemError
    from ks_inductor.problem_tracing import load_problem

    cfg = ctx.cfg
    files = plan(cfg)
    peers = peers_for(None, cfg.peers or [EAGER, INDUCTOR])
    for i, (level, pid, path) in enumerate(files):
        name = f"L{level}/{path.stem}"
        if ctx.done(name):
            continue
        ctx.progress(f"[{i + 1}/{len(files)}] {name}")
        base = dict(name=name, op=path.stem.split("_", 1)[1], phase="-")
        try:
            problem = load_problem(path)
            dtype = _dtype_of(problem)
            lookup = ctx.kernels.lookup(problem) if ctx.kernels is not None else None
            rejected, judge_info = None, None
            if lookup is not None and lookup.record is not None:
                rejected, judge_info = _judge_kernel(ctx, problem, lookup.record.source)
            setup = setup_problem(problem.source, cfg.device, cfg.protocol, filename=str(path))
            row = measure_problem(
                problem, setup, dtype=dtype, shape=problem.signature(), peer_builders=peers, lookup=lookup,
                device=cfg.device, protocol=cfg.protocol, ceilings=ctx.ceilings, tolerance=KERNELBENCH_TOLERANCE,
                notes=NOTES, kernel_rejected=rejected, **base)
            del setup
            if judge_info is not None:
                row.extra["judge"] = judge_info
        except (ProblemError, BenchUsageError) as e:
            row = WorkloadResult(dtype="-", shape="-", extra={"error": str(e)},
                                 tools={KERNELSMITH: ToolResult(status=FAILED, error=str(e))}, **base)
        except Exception as e:  # noqa: BLE001 - a problem that breaks is a failed row, the run goes on
            log.exception("problem %s failed", name)
            row = WorkloadResult(dtype="-", shape="-", extra={"error": f"{type(e).__name__}: {e}"},
                                 tools={KERNELSMITH: ToolResult(status=FAILED, error=f"{type(e).__name__}: {e}")},
                                 **base)
        row.extra.update(level=level, problem_id=pid, file=str(path))
        ctx.add(row)
        ctx.result.summary = summarize(ctx.result)
        ctx.save()
        release_device(cfg.device)
    ctx.result.summary = summarize(ctx.result)
    ctx.save()


def _ratio(row: WorkloadResult, peer: str) -> float | None:
    ks, p = row.tools.get(KERNELSMITH), row.tools.get(peer)
    if ks is None or not ks.ok or p is None or not p.ok:
        return None
    return p.median_ms / ks.median_ms  # type: ignore[operator]


def summarize(result: RunResult) -> dict[str, Any]:
    """fast_p and geometric means over all rows, and per level."""
    def block(rows: list[WorkloadResult]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for peer in (EAGER, INDUCTOR):
            out[f"vs_{peer}"] = summarize_speedups([_ratio(r, peer) for r in rows])
        ind_vs_eager = [r.tools[EAGER].median_ms / r.tools[INDUCTOR].median_ms  # type: ignore[operator]
                        for r in rows if r.tools.get(EAGER) and r.tools[EAGER].ok
                        and r.tools.get(INDUCTOR) and r.tools[INDUCTOR].ok]
        out["inductor_vs_eager_geomean"] = geomean(ind_vs_eager)
        return out

    rows = list(result.workloads)
    summary = {"all": block(rows), "levels": {}}
    for level in sorted({r.extra.get("level") for r in rows if r.extra.get("level") is not None}):
        summary["levels"][str(level)] = block([r for r in rows if r.extra.get("level") == level])
    return summary
