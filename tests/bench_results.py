"""A benchmark run's result as the runner writes it, made up: two workloads with every kind of tool outcome."""

from __future__ import annotations

from benchmarks.results import (
    FAILED,
    KERNELSMITH,
    NO_KERNEL,
    OK,
    UNAVAILABLE,
    RunResult,
    Speedup,
    ToolResult,
    WorkloadResult,
)


def _ok(ms: float) -> ToolResult:
    return ToolResult(OK, median_ms=ms, iqr_ms=ms / 50, min_ms=ms * 0.98, n=100, round_medians_ms=[ms] * 7)


def synthetic() -> RunResult:
    rms = WorkloadResult(
        name="rmsnorm-bf16-prefill", op="rmsnorm", dtype="bfloat16", phase="prefill", shape="4096x4096",
        problem_key="k1", bytes_moved=67117056, flops=0, floor_ms=0.0159, floor_bound="memory",
        tools={"eager": _ok(0.243), "inductor": _ok(0.0477), "inductor-max-autotune": _ok(0.0669),
               "liger": _ok(0.135), "F.rms_norm": _ok(0.026), KERNELSMITH: _ok(0.020)},
        speedups={"eager": Speedup(12.1, 11.8), "inductor": Speedup(2.38, 2.3), "F.rms_norm": Speedup(1.3, 1.25),
                  "liger": Speedup(6.7, 6.5), "inductor-max-autotune": Speedup(3.3, 3.2)},
        kernel={"id": 3, "sha256": "ab"})
    ce = WorkloadResult(
        name="cross_entropy-fp32-prefill", op="cross_entropy", dtype="float32", phase="prefill",
        shape="4096x32064", floor_ms=0.124, floor_bound="memory",
        tools={"eager": _ok(0.448), "inductor": _ok(0.195),
               "liger": ToolResult(FAILED, error="TypeError: forward() missing 'weight'"),
               "inductor-max-autotune": ToolResult(UNAVAILABLE, error="not asked"),
               KERNELSMITH: ToolResult(NO_KERNEL, error="no verified kernel for key abc")})
    return RunResult(suite="llm-ops", created="2026-11-22T10:00:00+00:00",
                     command="python -m benchmarks.run --suite llm-ops",
                     env={"device_name": "NVIDIA H200", "driver": "570.1", "torch": "2.11.0", "triton": "3.6.0",
                          "kernelsmith": "0.1.0", "liger_kernel": "0.8.5"},
                     ceilings={"copy_bytes_per_s": 4.227e12, "matmul_flops_per_s": {"bfloat16": 6.94e14}},
                     protocol={"rounds": 7, "rep_ms": 200.0, "rotating_sets": 3},
                     workloads=[rms, ce])
