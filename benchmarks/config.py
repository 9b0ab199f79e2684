"""What one benchmark run is asked to do; built by ``benchmarks.run`` (or ``kernelsmith bench``) from flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.measure import Protocol

# The decoder-layer (model) benchmark is benchmarks/gpu/decoder_layer.py: it warms a cache and compiles with the
# backend, which a runner suite does not.
SUITES = ("llm-ops", "kernelbench")


class BenchUsageError(Exception):
    """Bad flags or a missing prerequisite; the message says what to change."""


@dataclass
class RunConfig:
    suite: str
    device: str = "cuda"
    out: Path | None = None
    db: str | None = None
    backend: str | None = None  # judge backend for lookups/evolve: triton-cuda | triton-maca | triton-interpret
    evolve_budget: int = 0
    kernelsmith: bool = True
    peers: list[str] | None = None
    ops: list[str] | None = None
    dtypes: list[str] | None = None
    phases: list[str] | None = None
    smoke: bool = False
    protocol: Protocol = field(default_factory=Protocol)
    kernelbench: Path | None = None
    levels: list[int] | None = None
    problem_ids: list[int] | None = None
    limit: int | None = None
    resume: bool = False
    plots: bool = True
    command: str = ""

    def validate(self) -> None:
        if self.suite not in SUITES:
            raise BenchUsageError(f"unknown suite {self.suite!r}; choose from {', '.join(SUITES)}")
        if self.suite == "kernelbench" and self.kernelbench is None:
            raise BenchUsageError("the kernelbench suite needs --kernelbench PATH (a KernelBench checkout; it is "
                                  "read in place, never copied into this repository)")
        if self.evolve_budget < 0:
            raise BenchUsageError("--budget must be >= 0")
        if self.evolve_budget and not self.kernelsmith:
            raise BenchUsageError("--budget needs kernelsmith in the comparison (drop --no-kernelsmith)")
        if self.device not in ("cuda", "cpu"):
            raise BenchUsageError(f"unknown device {self.device!r}; use cuda or cpu")
        if self.peers:
            from benchmarks.peers import all_peer_names

            unknown = [p for p in self.peers if p not in all_peer_names()]
            if unknown:
                raise BenchUsageError(f"unknown peer {', '.join(unknown)}; choose from {', '.join(all_peer_names())}")
        if self.device == "cpu" and not self.smoke:
            raise BenchUsageError("CPU timings measure nothing a GPU user cares about; pass --smoke to exercise "
                                  "the runner on CPU")
