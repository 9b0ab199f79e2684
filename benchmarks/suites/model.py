"""The model suite: the Llama-style decoder layer of shared/anchors/measure_layer.py end to end.

The layer, its inputs and the kernelsmith path through ``torch.compile(backend="kernelsmith")`` belong to the
backend's ``benchmarks.gpu.decoder_layer``; this suite only calls ``decoder_layer.run(phase, ...)`` for prefill
(1 x 4096 tokens) and decode (16 sequences x 1 token, 2048 cached), and files what comes back next to the
other suites, with the roofline floor from this run's ceilings.

Expected from ``benchmarks.gpu.decoder_layer``::

    run(phase: str, *, device: str, db: str | None, protocol: benchmarks.measure.Protocol,
        peers: list[str] | None) -> benchmarks.results.WorkloadResult | dict

(a dict in :meth:`WorkloadResult.to_json` form is accepted too). ``bytes_moved`` and ``flops`` on the result
give the floor; ``benchmarks.measure.measure_tools`` does the checking and timing with the judge's protocol.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from benchmarks.config import BenchUsageError
from benchmarks.results import FAILED, KERNELSMITH, ToolResult, WorkloadResult
from benchmarks.roofline import floor_ms
from benchmarks.suites import SuiteContext, release_device

log = logging.getLogger(__name__)

PHASES = ("prefill", "decode")
SHAPES = {"prefill": "1 sequence x 4096 tokens", "decode": "16 sequences x 1 token, 2048 cached"}


def _layer_module() -> Any:
    try:
        return importlib.import_module("benchmarks.gpu.decoder_layer")
    except ImportError as e:
        raise BenchUsageError(f"the model suite needs benchmarks/gpu/decoder_layer.py (from the backend): {e}") \
            from None


def plan(cfg) -> list[str]:  # noqa: ANN001 - RunConfig
    layer = _layer_module()
    if not hasattr(layer, "run"):
        raise BenchUsageError("benchmarks.gpu.decoder_layer has no run(phase, ...) function")
    phases = cfg.phases or list(PHASES)
    bad = [p for p in phases if p not in PHASES]
    if bad:
        raise BenchUsageError(f"unknown phase {', '.join(bad)}; choose from {', '.join(PHASES)}")
    return phases


def run(ctx: SuiteContext) -> None:
    cfg = ctx.cfg
    phases = plan(cfg)
    layer = _layer_module()
    for i, phase in enumerate(phases):
        name = f"decoder-layer-{phase}"
        if ctx.done(name):
            continue
        ctx.progress(f"[{i + 1}/{len(phases)}] {name} ({SHAPES.get(phase, phase)})")
        try:
            got = layer.run(phase, device=cfg.device, db=cfg.db if cfg.kernelsmith else None,
                            protocol=cfg.protocol, peers=cfg.peers)
            row = got if isinstance(got, WorkloadResult) else WorkloadResult.from_json(
                {"name": name, "op": "decoder_layer", "dtype": "bfloat16", "phase": phase,
                 "shape": SHAPES.get(phase, ""), **dict(got)})
        except BenchUsageError:
            raise
        except Exception as e:  # noqa: BLE001 - reported as a failed row
            log.exception("decoder layer %s failed", phase)
            row = WorkloadResult(name=name, op="decoder_layer", dtype="bfloat16", phase=phase,
                                 shape=SHAPES.get(phase, ""), extra={"error": f"{type(e).__name__}: {e}"},
                                 tools={KERNELSMITH: ToolResult(status=FAILED, error=f"{type(e).__name__}: {e}")})
        if row.floor_ms is None and (row.bytes_moved or row.flops):
            # The layer is matmul-bearing: the floor is the longer of its bytes and its GEMM FLOPs.
            row.floor_ms, row.floor_bound = floor_ms(row.bytes_moved, row.flops, {"mm": 1}, row.dtype,
                                                     ctx.ceilings)
        ctx.add(row)
        release_device(cfg.device)
