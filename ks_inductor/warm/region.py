"""One region's search: what both executors run, here (one after another, or several threads sharing one judge)
or on a Ray worker. Its outcome is JSON, so that it crosses a process or a host unchanged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ks_inductor.contracts import SearchJudge, SearchStore

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig

log = logging.getLogger(__name__)


def region_config(config: EvolveConfig, left: float | None, share_s: float | None = None) -> EvolveConfig:
    """``config`` with its per-region time limit cut to the region's share of it (``share_s``, from its room) and
    to ``left`` seconds (what remains of the whole run). The grace a search's best gets for its final judgment
    (``EvolveConfig.final_grace_s``) stays within ``left``, so that the whole run keeps its bound."""
    from dataclasses import replace

    from ks_inductor.evolve.evolver import FINAL_GRACE_SHARE

    limit = config.time_limit_s
    for cap in (share_s, left):
        if cap is not None and (limit is None or limit > cap):
            limit = cap
    if left is None or limit is None:
        return config if limit == config.time_limit_s else replace(config, time_limit_s=limit)
    grace = FINAL_GRACE_SHARE * limit if config.final_grace_s is None else config.final_grace_s
    return replace(config, time_limit_s=limit, final_grace_s=max(0.0, min(grace, left - limit)))


def evolve_region(problem: Problem, config: EvolveConfig, store: SearchStore, judge: SearchJudge,
                  progress: Any = False) -> dict[str, Any]:
    """One region's search, as JSON: ``status`` (``done``, ``no-kernel`` or ``failed``), ``note`` (why there is no
    kernel, in one line, where there is none) and, when the search ran, ``summary`` (:meth:`EvolveSummary.to_json`). What both executors run, here or on a Ray worker."""
    from ks_inductor.evolve import EvolveError, evolve_problem

    try:
        res = evolve_problem(problem, config, store, judge=judge, progress=progress)
    except EvolveError as e:  # expected: no template covers it and no LLM is configured
        return {"status": "no-kernel", "note": str(e)[:300]}
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one problem failing must not stop the others
        log.warning("warming %s failed: %s", problem.key, e, exc_info=log.isEnabledFor(logging.DEBUG))
        return {"status": "failed", "note": f"{type(e).__name__}: {e}"[:300]}
    return {"status": "done", "note": res.why or res.note, "summary": res.to_json()}
