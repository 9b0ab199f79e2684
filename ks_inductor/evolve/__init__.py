"""The search: the evolutionary loop over a problem's candidates (population, archive, mutators, prompts,
trajectories). Where the search starts, the seeds, is :mod:`ks_inductor.seeds`.

    from ks_inductor.evolve import EvolveConfig, evolve_problem
    summary = evolve_problem(problem, EvolveConfig(budget=32), store)
"""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.config import EvolveConfig, LLMConfig

__all__ = ["EvolveConfig", "EvolveError", "EvolveSummary", "LLMConfig", "evolve_problem"]


def __getattr__(name: str) -> Any:  # lazy: the CLI and the backend import this package cheaply
    if name in ("evolve_problem", "EvolveSummary", "EvolveError", "Evolver"):
        from ks_inductor.evolve import evolver

        return getattr(evolver, name)
    raise AttributeError(name)
