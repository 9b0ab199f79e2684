"""The judge's verdict: one JSON-serializable dataclass, and feedback an LLM can act on."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Stages in the order a candidate passes them; ``stage`` is the last one reached.
STAGES = ("static", "load", "compile", "correctness", "timing", "done")

ACCEPTED = "accepted"  # correct; and, where timing means something, plausible
REJECTED = "rejected"  # wrong, unsafe or failed to run
QUARANTINED = "quarantined"  # correct but its speed is implausible: held for review, never served
ERROR = "error"  # the judge could not judge it (problem broken, infrastructure failure)
# The error of a judgment its caller's time limit cut off (``Judge.submit(deadline=...)``): no verdict either way.
DEADLINE_ERROR = "deadline: the caller's time limit ran out before this judgment finished; no verdict on the candidate"


@dataclass
class Timing:
    median_ms: float
    iqr_ms: float
    min_ms: float
    n: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Mismatch:
    trial: int
    output_index: int
    max_abs_error: float
    max_rel_error: float
    fraction_mismatched: float
    first_bad_index: list[int] | None
    rel_l2_error: float
    distribution: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    nan_dropped: int = 0  # elements where the reference is NaN and the candidate a number
    nan_added: int = 0  # and the other way round


@dataclass
class EvalResult:
    correct: bool = False
    verdict: str = REJECTED
    stage: str = "static"
    flags: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    backend: str = ""
    fingerprint: dict[str, Any] | None = None
    problem_key: str = ""
    candidate_hash: str = ""
    trials: int = 0
    mismatch: Mismatch | None = None
    timings: dict[str, Timing] = field(default_factory=dict)
    timing_meaningful: bool = False
    speedup_eager: float | None = None
    speedup_inductor: float | None = None
    speedup_eager_lcb: float | None = None
    speedup_inductor_lcb: float | None = None
    # Against each further baseline (``JudgeConfig.peers``: a serving stack's own kernel), its time over the
    # candidate's per call, and that ratio's lower confidence bound.
    speedup_peers: dict[str, float] = field(default_factory=dict)
    speedup_peer_lcbs: dict[str, float] = field(default_factory=dict)
    # The same tools timed inside a CUDA graph over cold inputs (GPU judgments): per baseline, its time over the
    # candidate's, and that ratio's lower confidence bound.
    steady_timings: dict[str, Timing] = field(default_factory=dict)
    steady_speedups: dict[str, float] = field(default_factory=dict)
    steady_speedup_lcbs: dict[str, float] = field(default_factory=dict)
    # Whether the CUDA-graph timing decides (``JudgeConfig.in_graphs``): the deployment runs kernels inside CUDA
    # graphs. Where it launches each call on its own (transformers' generate), the per-call timing decides, and the
    # CUDA-graph figures are kept for the record.
    in_graphs: bool = True
    # Served: the per-call lower confidence bound clears 1 + margin against every baseline, and (where the CUDA
    # graph decides) inside a CUDA graph the candidate is not slower than any.
    faster: bool = False
    # The candidate's device time per call is within a few kernel launches (``service.LAUNCH_BOUND_LAUNCHES``): what
    # such a call costs where it is served is mostly host time, which device timing does not see.
    launch_bound: bool = False
    # Why a correct, timed candidate is not served as faster (``speed_why``), in one line; "" where it is.
    not_faster: str = ""
    # Per tool timed (the candidate and each baseline; "<tool> (graph)" for the CUDA-graph timing): the spin before
    # each timed call it ended at (us), the calls timed again because the host had fallen behind the GPU, and the
    # samples kept although it still was (``timing.Lead``).
    timing_leads: dict[str, dict[str, float]] = field(default_factory=dict)
    final: bool = False  # timed with the final protocol (what serving requires), not a search's short one
    roofline_floor_ms: float | None = None
    roofline_fraction: float | None = None
    launches: dict[str, int] = field(default_factory=dict)
    # What the judge itself could not do as configured (fewer trials for lack of scratch disk, ...): not about the
    # candidate, but a reader of the verdict should know.
    notes: list[str] = field(default_factory=list)
    log_tail: str = ""
    # The launch plan the trusted side executed, as JSON with its constants' bytes, where it reads none of the
    # model's own tensors (else ""): the stored kernel carries it (``KernelRecord.plan``); a verdict's JSON does not.
    plan: str = field(default="", repr=False)
    duration_s: float = 0.0
    # Where ``duration_s`` went, per stage (``ks_inductor.judge.clock.STAGE_NAMES``); the stages sum to it.
    stage_s: dict[str, float] = field(default_factory=dict)
    # Seconds the worker held the device, shared (correctness) and exclusive (timing); overlaps ``stage_s``.
    device_held_s: dict[str, float] = field(default_factory=dict)

    @property
    def own_s(self) -> float:
        """The judgment's own seconds: its wall time less its wait for the device and for the problem's reference
        (computed once per problem, by whichever judgment came first)."""
        return max(0.0, self.duration_s - self.stage_s.get("device_wait", 0.0) - self.stage_s.get("reference", 0.0))

    @property
    def accepted(self) -> bool:
        return self.verdict == ACCEPTED

    @property
    def best_baseline(self) -> str | None:
        ms = {k: v.median_ms for k, v in self.timings.items() if k != "candidate"}
        return min(ms, key=ms.get) if ms else None

    @property
    def speedup_best(self) -> float | None:
        """Speedup against the fastest baseline measured in the same run."""
        vals = [v for v in (self.speedup_eager, self.speedup_inductor, *self.speedup_peers.values()) if v is not None]
        return min(vals) if vals else None

    @property
    def graph_slower(self) -> bool:
        """Slower than a baseline inside a CUDA graph, where that decides (``in_graphs``)."""
        return self.in_graphs and min(self.steady_speedups.values(), default=1.0) < 1.0

    @property
    def served_by_race(self) -> bool:
        """Correct and launch-bound, not faster by the margin, and not slower than any baseline on the device, per
        call or (where it decides) inside a CUDA graph: a serving stack's race at load time, which times the call as
        the stack makes it, decides whether it serves (``kernel_cache.record.RACE``)."""
        if not (self.correct and self.timing_meaningful and self.launch_bound) or self.faster:
            return False
        per_call = [v for v in (self.speedup_eager, self.speedup_inductor, *self.speedup_peers.values())
                    if v is not None]
        return bool(per_call) and min(per_call) >= 1.0 and not self.graph_slower

    def speed_why(self, margin: float) -> str:
        """Why a correct, timed candidate is not ``faster``: each per-call ratio whose lower bound misses 1 +
        ``margin``, each CUDA-graph ratio below 1, and whether a serving stack's race is left to decide; "" where it
        is faster."""
        if self.faster or not (self.correct and self.timing_meaningful):
            return ""
        per_call = {"eager": (self.speedup_eager, self.speedup_eager_lcb),
                    "inductor": (self.speedup_inductor, self.speedup_inductor_lcb),
                    **{n: (v, self.speedup_peer_lcbs.get(n)) for n, v in self.speedup_peers.items()}}
        short = [f"{n} {lb:.3f} ({v:.3f}x)" for n, (v, lb) in per_call.items()
                 if v is not None and lb is not None and lb < 1 + margin]
        graph = [f"{n} {v:.3f}x" for n, v in sorted(self.steady_speedups.items()) if v < 1.0 and self.in_graphs]
        parts = []
        if short:
            parts.append(f"per call, lower bound under {1 + margin:g} against " + ", ".join(short))
        if graph:
            parts.append("in a CUDA graph, slower than " + ", ".join(graph))
        why = "not faster: " + "; ".join(parts or ["no baseline was timed"])
        if self.launch_bound:
            why += ("; launch-bound and not slower, so a serving stack's race decides" if self.served_by_race
                    else "; launch-bound and slower somewhere, so no race")
        return why

    @property
    def speedup_best_lcb(self) -> float | None:
        vals = [v for v in (self.speedup_eager_lcb, self.speedup_inductor_lcb, *self.speedup_peer_lcbs.values())
                if v is not None]
        return min(vals) if vals else None

    @property
    def score(self) -> float | None:
        """What a search maximizes: the speedup against the best baseline per call, and where the judge also timed
        the CUDA-graph steady state, the geometric mean of the two, so a kernel must be fast both launched on its
        own and inside a served model's graph."""
        return _combined(self.speedup_best, min(self.steady_speedups.values(), default=None))

    @property
    def score_lcb(self) -> float | None:
        return _combined(self.speedup_best_lcb, min(self.steady_speedup_lcbs.values(), default=None))

    @property
    def candidate_ms(self) -> float | None:
        t = self.timings.get("candidate")
        return t.median_ms if t else None

    def reject(self, flag: str, reason: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)
        self.reasons.append(reason)
        if self.verdict != ERROR:
            self.verdict = REJECTED
        self.correct = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("plan")
        d["accepted"] = self.accepted
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if data.get("mismatch"):
            data["mismatch"] = Mismatch(**data["mismatch"])
        data["timings"] = {k: Timing(**v) for k, v in (data.get("timings") or {}).items()}
        data["steady_timings"] = {k: Timing(**v) for k, v in (data.get("steady_timings") or {}).items()}
        data["stage_s"] = {k: float(v) for k, v in (data.get("stage_s") or {}).items()}
        return cls(**data)

    def feedback_text(self) -> str:
        """What went right and wrong, written for a model that will make the next change."""
        lines = [f"Verdict: {self.verdict} (stage reached: {self.stage})."]
        if self.error:
            lines.append(f"Error: {self.error}")
        for r in self.reasons:
            lines.append(f"- {r}")
        for n in self.notes:
            lines.append(f"Judge's note: {n}")
        if self.mismatch is not None:
            m = self.mismatch
            lines.append(
                f"Output {m.output_index} differs from the reference on trial {m.trial} "
                f"(inputs drawn from '{m.distribution}'): max abs error {m.max_abs_error:.3g}, max rel error "
                f"{m.max_rel_error:.3g}, {100 * m.fraction_mismatched:.2f}% of elements outside atol={m.atol:g} "
                f"rtol={m.rtol:g}, relative L2 error {m.rel_l2_error:.3g}; first bad index {m.first_bad_index}."
            )
            if m.nan_dropped:
                lines.append(
                    f"The reference is NaN at {m.nan_dropped} elements where the candidate gives numbers. torch's "
                    "max, min, clamp and relu return NaN when an operand is NaN; Triton's tl.maximum, tl.minimum, "
                    "tl.max and tl.min drop it unless told otherwise (tl.maximum(a, b, "
                    "propagate_nan=tl.PropagateNan.ALL); tl.reduce with such a combine function).")
            if m.nan_added:
                lines.append(f"The candidate gives NaN at {m.nan_added} elements where the reference has numbers.")
        if self.correct and self.timing_meaningful and "candidate" in self.timings:
            c = self.timings["candidate"]
            parts = [f"candidate {c.median_ms:.4f} ms (IQR {c.iqr_ms:.4f})"]
            for name in ("eager", "inductor", *sorted(self.speedup_peers)):
                if name in self.timings:
                    parts.append(f"{name} {self.timings[name].median_ms:.4f} ms")
            lines.append("Timing: " + ", ".join(parts) + ".")
            if self.speedup_eager is not None:
                lines.append(f"Speedup vs eager {self.speedup_eager:.3f}x (lower bound {self.speedup_eager_lcb:.3f}x).")
            if self.speedup_inductor is not None:
                lines.append(
                    f"Speedup vs torch.compile {self.speedup_inductor:.3f}x "
                    f"(lower bound {self.speedup_inductor_lcb:.3f}x)."
                )
            for name, ratio in sorted(self.speedup_peers.items()):
                lines.append(f"Speedup vs {name}'s own kernel {ratio:.3f}x "
                             f"(lower bound {self.speedup_peer_lcbs[name]:.3f}x).")
            if "candidate" in self.steady_timings:
                parts = [f"{name} {t.median_ms:.4f} ms" for name, t in self.steady_timings.items()]
                lines.append("Inside a CUDA graph, calls back to back on cold inputs (how serving runs it): "
                             + ", ".join(parts) + ".")
            if self.not_faster:
                lines.append(f"Not served as faster: {self.not_faster.removeprefix('not faster: ')}.")
            if self.roofline_fraction is not None:
                lines.append(
                    f"Reaches {100 * self.roofline_fraction:.1f}% of the roofline floor "
                    f"({self.roofline_floor_ms:.4f} ms): "
                    + ("close to the limit; only small gains remain." if self.roofline_fraction > 0.85
                       else "far from the memory/compute limit; there is room to improve.")
                )
        elif self.correct and not self.timing_meaningful:
            lines.append("Correct. Timing is not meaningful on this backend (Triton interpreter on CPU).")
        if self.log_tail:
            lines.append("Worker output (tail):\n" + self.log_tail[-2000:])
        return "\n".join(lines)


def _combined(per_call: float | None, steady: float | None) -> float | None:
    if per_call is None or steady is None:
        return per_call
    return (per_call * steady) ** 0.5
