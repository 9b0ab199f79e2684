"""Benchmark suites. Each is ``run(ctx) -> None``: it appends rows to ``ctx.result`` and calls ``ctx.save()``
after each, so a run cut short keeps everything measured so far (and ``--resume`` picks up from there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.config import RunConfig
from benchmarks.results import RunResult
from benchmarks.roofline import Ceilings


@dataclass
class SuiteContext:
    cfg: RunConfig
    result: RunResult
    ceilings: Ceilings
    kernels: Any  # benchmarks.kernelsmith_peer.KernelSource | None
    save: Callable[[], None]
    progress: Callable[[str], None]  # called with a line of status text

    def done(self, name: str) -> bool:
        w = self.result.workload(name)
        return self.cfg.resume and w is not None

    def add(self, row: Any) -> None:
        self.result.workloads = [w for w in self.result.workloads if w.name != row.name] + [row]
        self.save()


def release_device(device: str) -> None:
    """Between workloads: forget compiled graphs and give cached device memory back."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()
