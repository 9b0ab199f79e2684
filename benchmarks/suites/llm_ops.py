"""The llm-ops suite: serving ops, bf16 and fp16, prefill and decode token counts (see benchmarks.workloads)."""

from __future__ import annotations

import logging

from benchmarks.config import BenchUsageError
from benchmarks.measure import measure_problem, setup_problem
from benchmarks.peers import NOTES, peers_for
from benchmarks.results import FAILED, KERNELSMITH, ToolResult, WorkloadResult
from benchmarks.suites import SuiteContext, release_device
from benchmarks.workloads import FULL, SMOKE, llm_ops_workloads

log = logging.getLogger(__name__)


def matmul_dtypes(cfg) -> list[str]:  # noqa: ANN001 - RunConfig
    return list(dict.fromkeys(["bfloat16", *(cfg.dtypes or ["bfloat16", "float16"])]))


def plan(cfg) -> list:  # noqa: ANN001 - RunConfig
    """The workloads this run will measure; raises BenchUsageError on bad filters, before anything is written."""
    try:
        return llm_ops_workloads(cfg.ops, cfg.dtypes, cfg.phases, SMOKE if cfg.smoke else FULL)
    except ValueError as e:
        raise BenchUsageError(str(e)) from None


def run(ctx: SuiteContext) -> None:
    from ks_inductor.judge import JudgeConfig

    cfg = ctx.cfg
    tolerances = JudgeConfig()
    workloads = plan(cfg)
    for i, w in enumerate(workloads):
        if ctx.done(w.name):
            continue
        ctx.progress(f"[{i + 1}/{len(workloads)}] {w.name} ({w.shape})")
        try:
            problem = w.problem()
            setup = setup_problem(w.source, cfg.device, cfg.protocol, filename=f"<workload {w.name}>")
            lookup = ctx.kernels.lookup(problem) if ctx.kernels is not None else None
            row = measure_problem(
                problem, setup, name=w.name, op=w.op, dtype=w.dtype, phase=w.phase, shape=w.shape,
                peer_builders=peers_for(w.op, cfg.peers), lookup=lookup, device=cfg.device,
                protocol=cfg.protocol, ceilings=ctx.ceilings, tolerance=tolerances.tolerance(w.dtype), notes=NOTES)
            del setup
        except Exception as e:  # noqa: BLE001 - one broken workload is a row with its error, the run goes on
            log.exception("workload %s failed", w.name)
            row = WorkloadResult(name=w.name, op=w.op, dtype=w.dtype, phase=w.phase, shape=w.shape,
                                 tools={KERNELSMITH: ToolResult(status=FAILED, error=f"{type(e).__name__}: {e}")},
                                 extra={"error": f"setting the workload up failed: {type(e).__name__}: {e}"})
        ctx.add(row)
        release_device(cfg.device)
