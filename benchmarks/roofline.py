"""The roofline floor of a workload: the time its bytes take at the measured copy bandwidth, or its matmul FLOPs
at the measured matmul rate, whichever is longer.

Both ceilings are measured on the machine at the start of each run (never taken from a datasheet), so the floor
is what this machine demonstrably sustains. Pointwise arithmetic is not given a compute floor: the problem model
counts it only roughly and it never bounds the memory-bound ops measured here.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# aten ops whose FLOPs go through the matmul units; a problem containing one of them gets a compute floor.
_MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "convolution", "_scaled_mm",
                         "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                         "_scaled_dot_product_cudnn_attention"})


@dataclass
class Ceilings:
    copy_bytes_per_s: float | None = None  # bytes read + written per second, device to device
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)  # per dtype name

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Ceilings:
        data = data or {}
        return cls(copy_bytes_per_s=data.get("copy_bytes_per_s"),
                   matmul_flops_per_s=dict(data.get("matmul_flops_per_s") or {}))


def has_matmul(op_summary: dict[str, int]) -> bool:
    return any(op in _MATMUL_OPS for op in op_summary)


def floor_ms(bytes_moved: int, flops: int, op_summary: dict[str, int], dtype: str,
             ceilings: Ceilings) -> tuple[float | None, str | None]:
    """(floor in ms, "memory" | "compute") for a problem; (None, None) when no ceiling was measured."""
    mem = bytes_moved / ceilings.copy_bytes_per_s * 1e3 if ceilings.copy_bytes_per_s and bytes_moved else None
    comp = None
    if flops and has_matmul(op_summary):
        peak = ceilings.matmul_flops_per_s.get(dtype)
        if peak:
            comp = flops / peak * 1e3
    if mem is None and comp is None:
        return None, None
    if comp is not None and (mem is None or comp > mem):
        return comp, "compute"
    return mem, "memory"


def measure_ceilings(device: str, dtypes: list[str]) -> Ceilings:
    """Copy bandwidth and, per dtype, the cuBLAS matmul rate, with the judge's measuring functions."""
    if device == "cpu":
        return Ceilings()
    import torch

    from ks_inductor.judge.timing import measure_copy_bandwidth, measure_matmul_peak

    c = Ceilings(copy_bytes_per_s=measure_copy_bandwidth(device))
    for name in dict.fromkeys(dtypes):
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            continue
        c.matmul_flops_per_s[name] = measure_matmul_peak(device, dt)
        torch.cuda.empty_cache()
    log.info("ceilings: copy %.0f GB/s, matmul %s", (c.copy_bytes_per_s or 0) / 1e9,
             {k: f"{v / 1e12:.0f} TFLOP/s" for k, v in c.matmul_flops_per_s.items()})
    return c
