"""``warm`` searches several regions at once with one shared judge: every region gets its verdict, the same as a
sequential run's, and the searches really overlap."""

from __future__ import annotations

import threading

import pytest
import torch

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.models import ThreeRegions
from ks_inductor.compiler import backend as B
from ks_inductor.evolve import EvolveConfig
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.warm import problems_from_model, warm


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    B.forget_stores()


def test_parallel_regions_give_every_region_the_sequential_verdict(tmp_path, monkeypatch) -> None:
    import ks_inductor.evolve as E

    torch.manual_seed(0)
    problems = problems_from_model(ThreeRegions(), (torch.randn(8, 32),), db=f"sqlite:///{tmp_path}/trace.db",
                                   judge_backend="triton-interpret")
    assert len({p.key for p in problems}) == 3

    active, peak, lock = [0], [0], threading.Lock()
    original = E.evolve_problem

    def counted(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(E, "evolve_problem", counted)
    # Inductor's code generation is left out: it is memoized per process and would only lengthen the test.
    base = {"budget": 2, "islands": 1, "parallel": 2, "seed": 1, "backend": "triton-interpret", "judge_trials": 2,
            "inductor_seeds": False}
    with Judge(JudgeConfig.for_search(backend="triton-interpret", trials=2)) as judge:
        one = warm(problems, KernelStore(f"sqlite:///{tmp_path}/seq.db"),
                   EvolveConfig(**base, parallel_regions=1), judge=judge)
        assert peak[0] == 1
        peak[0] = 0
        many = warm(problems, KernelStore(f"sqlite:///{tmp_path}/par.db"),
                    EvolveConfig(**base, parallel_regions=3), judge=judge)
    assert peak[0] >= 2  # the regions' searches overlapped
    assert [i.key for i in many.items] == [i.key for i in one.items]
    assert all(i.status in ("found", "no-kernel") for i in many.items), [(i.name, i.status, i.note)
                                                                          for i in many.items]
    assert [i.status for i in many.items] == [i.status for i in one.items]
    assert [i.judged for i in many.items] == [i.judged for i in one.items]
    assert any(i.status == "found" for i in many.items)


def test_whole_run_limit_holds_with_parallel_regions(tmp_path) -> None:
    """``total_time_s`` bounds the whole warm, the judge's start included: searches with budgets far beyond it
    stop with it, and a region that could not start in time is not-run."""
    import time

    torch.manual_seed(0)
    problems = problems_from_model(ThreeRegions(), (torch.randn(8, 32),), db=f"sqlite:///{tmp_path}/trace.db",
                                   judge_backend="triton-interpret")
    limit = 20.0
    cfg = EvolveConfig(budget=500, islands=1, parallel=2, seed=1, backend="triton-interpret", judge_trials=2,
                       inductor_seeds=False, parallel_regions=2)
    t0 = time.monotonic()
    summary = warm(problems, KernelStore(f"sqlite:///{tmp_path}/k.db"), cfg, total_time_s=limit)
    took = time.monotonic() - t0
    assert took <= 1.10 * limit, took
    statuses = sorted(i.status for i in summary.items)
    # Two regions searched until the limit, the third one never started.
    assert statuses.count("not-run") == 1 and "found" in statuses, [(i.name, i.status, i.note)
                                                                    for i in summary.items]
