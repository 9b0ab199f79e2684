"""Judge settings. Defaults follow the issue: 5 trials, fp32 1e-4, fp16/bf16 1e-2, a 3% speedup margin."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ks_core.config import derive_one
from ks_inductor.judge.timing import FINAL, SEARCH

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    # dtype: (atol, rtol), applied as |out - ref| <= atol + rtol * |ref|, plus a relative L2 bound of rtol.
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}

# In the order trials take them; a problem too large for the scratch disk keeps the first few. "nan" is uniform_neg's
# values with NaN among them (inputs.py), so it took uniform_neg's place rather than add a trial.
DISTRIBUTIONS = ("native", "normal", "nan", "large", "normal_shifted")


@dataclass
class JudgeConfig:
    backend: str | None = None  # triton-cuda | triton-maca | triton-interpret; None: detect
    trials: int = 5
    tolerances: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    distributions: tuple[str, ...] = DISTRIBUTIONS
    compile_timeout_s: float = 300.0
    run_timeout_s: float = 120.0
    memory_limit_mb: int = field(default_factory=lambda: derive_one("JudgeConfig", "memory_limit_mb"))
    device_memory_fraction: float = 0.8
    # Timing (GPU): interleaved rounds of candidate and baselines, each call preceded by an L2 flush.
    rounds: int = FINAL.rounds
    warmup_ms: float = FINAL.warmup_ms
    rep_ms: float = FINAL.rep_ms
    min_reps: int = FINAL.min_reps
    max_reps: int = FINAL.max_reps
    rotating_sets: int = FINAL.rotating_sets
    baselines: tuple[str, ...] = ("eager", "inductor")
    # The protocol of a final judgment (``final=True``): what a kernel must pass before it is served. A search may
    # time its many children with a lighter protocol above; its winner is judged again with this one.
    final_rounds: int = FINAL.rounds
    final_rep_ms: float = FINAL.rep_ms
    final_max_reps: int = FINAL.max_reps
    final_warmup_ms: float = FINAL.warmup_ms
    final_baselines: tuple[str, ...] = ("eager", "inductor")
    # Baselines beyond eager and Inductor: a name in ``baselines`` mapped to ``"module:function"``, a factory the
    # trusted baselines job calls with the reference model and one set of inputs. It returns what a serving stack
    # runs for the problem (its own kernel), or None where the stack has none; it is timed like eager and must
    # compute what the reference computes (``reference_job.peer_baseline``).
    peers: dict[str, str] = field(default_factory=dict)
    # Also time candidate and baselines inside a CUDA graph over cold inputs (GPU only): how serving runs them.
    # Final judgments always do when this is on; a search's children only with ``search_steady_state`` (the graphs'
    # capture and replays cost a search child more device time than its per-call timing, and the winner is judged
    # again with them before it is stored).
    steady_state: bool = True
    search_steady_state: bool = True
    # Whether the deployment runs kernels inside CUDA graphs (a compiled graph's, a serving engine's decode): a
    # candidate slower there than a baseline is then not faster. Off for one that launches each call on its own
    # (transformers' generate), where what a call costs per call, host included, decides; the CUDA-graph timing is
    # still taken and reported.
    in_graphs: bool = True
    margin: float = 0.03
    max_plausible_speedup: float = 10.0
    # Plausibility against the roofline floor: faster than this fraction of the floor is quarantined.
    floor_slack: float = 0.9
    # Static rules on by default; tests switch them off to prove the runtime guards stand on their own.
    static_rules: bool = True
    seed: int | None = None  # secret per-judge seed; None draws one from os.urandom
    keep_workdir: bool = False

    @classmethod
    def for_search(cls, **overrides: Any) -> JudgeConfig:
        """Short timing for an optimizer's many children; final judgments keep the full protocol. Both baselines
        are timed (once per problem): a search aims at the faster of the two, and they give the region's room."""
        base: dict[str, Any] = {"rounds": SEARCH.rounds, "rep_ms": SEARCH.rep_ms, "warmup_ms": SEARCH.warmup_ms,
                                "max_reps": SEARCH.max_reps, "search_steady_state": False}
        base.update(overrides)
        return cls(**base)

    def protocol(self, final: bool) -> dict[str, Any]:
        if final:
            return {"rounds": self.final_rounds, "rep_ms": self.final_rep_ms, "max_reps": self.final_max_reps,
                    "warmup_ms": self.final_warmup_ms, "baselines": list(self.final_baselines),
                    "steady": self.steady_state, "peers": dict(self.peers)}
        return {"rounds": self.rounds, "rep_ms": self.rep_ms, "max_reps": self.max_reps, "warmup_ms": self.warmup_ms,
                "baselines": list(self.baselines), "steady": self.steady_state and self.search_steady_state,
                "peers": dict(self.peers)}

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return self.tolerances.get(dtype, (1e-2, 1e-2))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
