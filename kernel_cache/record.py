"""KernelRecord: a verified winner as the cache stores it, with provenance."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

VERIFIED = "verified"
QUARANTINED = "quarantined"
REJECTED = "rejected"
# Correct and not slower on the device, but launch-bound and not faster there by the judge's margin: what its call
# costs where it is served is mostly host time, which only a serving stack's race at load time measures. Packs carry
# it and a stack serves it only where it wins that race; the compile backend never serves it.
RACE = "race"
STATUSES = (VERIFIED, RACE, QUARANTINED, REJECTED)


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


@dataclass
class KernelRecord:
    problem_key: str
    source: str
    backend: str
    fingerprint: dict[str, Any]  # EnvFingerprint.to_json()
    status: str = VERIFIED
    launch_params: dict[str, Any] = field(default_factory=dict)
    op_family: str | None = None
    median_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None
    speedup_eager: float | None = None
    speedup_inductor: float | None = None
    speedup_lcb: float | None = None
    # Inside a CUDA graph, the fastest baseline's time over the kernel's (``EvalResult.steady_speedups``, the least);
    # None where it was not timed in one. How a stack that captures its decode step would see it, beside the per-call
    # figures a stack that launches each call pays.
    speedup_graph: float | None = None
    trials: int = 0
    timed: bool = True  # False for kernels verified by the interpreter: never served on a GPU
    run_id: str | None = None
    parent_id: str | None = None
    candidate_id: str | None = None
    # The launch plan the judge's trusted side executed for this kernel's verdict (``ks_inductor.judge.plan``), as
    # JSON with its constants' bytes; "" where it reads the model's own tensors. Serving launches it at the judged
    # signature rather than running the kernel's forward (``ks_inductor.judged_plan``).
    plan: str = ""
    sha256: str = ""
    id: int | None = None
    created_at: float | None = None

    def __post_init__(self) -> None:
        if not self.sha256:
            self.sha256 = source_sha256(self.source)
        self.plan = self.plan or ""  # a row stored before plans were kept reads NULL

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class StepRecord:
    """One evolution step: a parent, the mutation applied, the child, and the judge's verdict on it."""

    run_id: str
    problem_key: str
    child_id: str
    mutation: str
    parent_id: str | None = None
    diff: str = ""
    prompt: str | None = None
    response: str | None = None
    verdict: str = ""
    correct: bool = False
    parent_speedup: float | None = None
    child_speedup: float | None = None
    parent_speedup_lcb: float | None = None
    child_speedup_lcb: float | None = None
    speedup_delta: float | None = None
    noise: float | None = None  # IQR / median of the child's timing
    # The child's score over its parent's, where both were timed and correct: what the step's change (``mutation``: a
    # structural operator, a parameter move, an LLM edit) gained. Kept in the row's detail, as the speedups are.
    gain: float | None = None
    feedback: str = ""
    parent_source: str = ""
    child_source: str = ""
    island: int | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    # The environment the child was judged in (``EnvFingerprint.to_json()``), as the judge stamped its verdict:
    # what a training row names as the hardware that timed the step. None for a step judged nowhere (a failed
    # mutation) and for steps stored before it was kept.
    fingerprint: dict[str, Any] | None = None
    id: int | None = None
    created_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
