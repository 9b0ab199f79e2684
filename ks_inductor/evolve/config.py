"""Settings of an evolution run and of the LLM endpoint (plain dataclasses; options override environment). Where
each field comes from is in :mod:`ks_core.config`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ks_core.config import derive


@dataclass
class LLMConfig:
    """An OpenAI-compatible endpoint. Unset fields come from ``KERNELSMITH_LLM_BASE_URL``, ``_MODEL``,
    ``_API_KEY`` and ``_CONCURRENCY``."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    concurrency: int | None = None
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    max_tokens: int = 4096
    temperature: float = 0.7
    fallback: str | None = None  # "embedded": use the embedded mutator when the endpoint cannot be reached
    inspirations: int = 3

    def resolved(self) -> LLMConfig:
        """The fields left unset filled from the environment (``ks_core.config``), then from the defaults."""
        env = derive("LLMConfig")
        return LLMConfig(
            base_url=self.base_url or env["base_url"],
            model=self.model or env["model"],
            api_key=self.api_key or env["api_key"] or "not-needed",
            concurrency=int(self.concurrency or env["concurrency"] or 2),
            timeout_s=self.timeout_s, max_retries=self.max_retries, backoff_s=self.backoff_s,
            max_tokens=self.max_tokens, temperature=self.temperature, fallback=self.fallback,
            inspirations=self.inspirations,
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key", None)  # never persisted
        return d


@dataclass
class EvolveConfig:
    budget: int = 64  # judgments, re-timings included
    time_limit_s: float | None = None
    islands: int = 2
    backend: str | None = None  # judge backend; None: detect
    llm: LLMConfig | None = None  # None: the embedded mutator
    seed: int = 0
    resume: bool = True
    parallel: int | None = None  # judgments in flight; None: 2 on CPU, 4 on a GPU
    margin: float = 0.02  # a child displaces an incumbent when its speedup LCB beats it by this much
    retime_every: int = 6  # re-time the best elite after this many judged children (timed backends)
    elite_size: int = 12
    migration_interval: int = 6
    judge_trials: int | None = None
    # Leading elites judged again at the end with the judge's final protocol; the winner is chosen by that.
    final_candidates: int = 3
    # Seconds the final judgment of the search's best may run past ``time_limit_s`` (None: ``FINAL_GRACE_SHARE`` of
    # it). ``warm`` sets 0 where a region's limit is what is left of the whole run's.
    final_grace_s: float | None = None
    # Seed from Inductor's own kernels too (every problem Inductor compiles to Triton gets a seed).
    inductor_seeds: bool = True
    # Regions ``warm`` searches at once, sharing one judge; None: one per local device, at least 2 on the CPU.
    parallel_regions: int | None = None
    # A region whose faster baseline runs at this fraction of its floor or above is settled: no search runs there
    # (ks_inductor.judge.room). None: 0.9 where the judge times candidates; on the interpreter, no room is measured.
    settle_at: float | None = None
    # What a kernel must beat: the paths the deployment would otherwise run. None: eager and Inductor (what
    # ``backend="kernelsmith"`` chooses among); ("eager",) for a stack that runs the model's own layers, such as a
    # transformers pack, whose kernels are then stored without a speedup over Inductor and never serve a compile.
    baselines: tuple[str, ...] | None = None
    # Baselines beyond eager and Inductor that ``baselines`` may name: name -> ``"module:function"``, the factory
    # of a serving stack's own kernel for a problem (``JudgeConfig.peers``).
    peers: dict[str, str] = field(default_factory=dict)
    # Whether the deployment runs the kernels inside CUDA graphs, so that a kernel slower there is not faster
    # (``JudgeConfig.in_graphs``); False for a stack that launches each call on its own, such as a transformers pack.
    in_graphs: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["llm"] = self.llm.to_json() if self.llm else None
        return d
