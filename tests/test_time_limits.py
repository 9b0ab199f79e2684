"""Limits that hold: ``time_limit_s`` bounds a whole ``evolve_problem`` call on the interpreter judge (the judge's
start, the search, what is in flight at the end, the cache writes and the judge's stop); the final judgment of the
search's best gets a grace beyond it, and a final protocol that cannot run even then leaves the search's best
unverified, never served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.evolve.evolver import FINAL_GRACE_SHARE
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.judge.verdict import DEADLINE_ERROR, EvalResult, Timing

LIMIT_S = 20.0


def test_time_limit_bounds_the_whole_run_within_ten_percent(tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    # A budget the interpreter cannot judge in the limit: the limit, not the budget, ends the run. Inductor's code
    # generation (about 16 s of this limit on two cores, once per problem and process) is left out so that the
    # search itself runs into the limit.
    cfg = EvolveConfig(budget=500, islands=2, parallel=2, seed=5, time_limit_s=LIMIT_S, backend="triton-interpret",
                       judge_trials=2, inductor_seeds=False)
    t0 = time.monotonic()
    summary = evolve_problem(problem, cfg, store, progress=False)
    took = time.monotonic() - t0
    assert took <= 1.10 * LIMIT_S, took
    assert took >= 0.8 * LIMIT_S, took  # the limit, not a failure, ended it
    assert summary.stop_reason == "time" and 2 <= summary.judged < 500
    assert summary.wall_s <= 1.10 * LIMIT_S
    # Every judgment counted has its verdict stored; the ones cut off at the limit left nothing behind.
    steps = store.steps(run_id=summary.run_id)
    assert len(steps) == summary.judged
    assert all(s.verdict != "error" for s in steps)
    assert summary.best is not None and summary.best.status == "verified" and summary.best.timed is False


class _TimedJudge:
    """The interpreter judge dressed as a GPU's: the search's verdicts come with times (the candidate 1.2x eager's
    speed), and a final judgment takes longer than any limit (it runs until its deadline cuts it off)."""

    # Its baselines are the interpreter's, which a GPU judge's search would not time again for a room: no room.
    room = None

    def __init__(self, judge) -> None:
        self._judge = judge
        self.fingerprint = h200()
        self.finals = 0
        self._pool = ThreadPoolExecutor(4)

    def __getattr__(self, name):
        return getattr(self._judge, name)

    def _timed(self, problem, source, deadline):
        res = self._judge.evaluate(problem, source, deadline=deadline)
        if res.accepted:
            res.timing_meaningful, res.faster = True, True
            res.timings = {"candidate": Timing(1.0, 0.01, 1.0, 10), "eager": Timing(1.2, 0.01, 1.2, 10)}
            res.speedup_eager, res.speedup_eager_lcb = 1.2, 1.15
        return res

    def _final(self, deadline):
        time.sleep(max(0.0, deadline - time.monotonic()))
        return EvalResult(verdict="error", error=DEADLINE_ERROR)

    def submit(self, problem, source, timing=None, final=False, deadline=None):
        if final:
            self.finals += 1
            return self._pool.submit(self._final, deadline)
        return self._pool.submit(self._timed, problem, source, deadline)


def test_a_final_protocol_cut_off_by_the_limit_stores_the_search_best_unverified(tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    limit = 12.0
    # One leader: the final judgments' estimate (from the interpreter's slow search judgments) fits the limit, so
    # the search keeps time for them and they start.
    cfg = EvolveConfig(budget=500, islands=2, parallel=2, seed=5, time_limit_s=limit, inductor_seeds=False,
                       final_candidates=1)
    with Judge(JudgeConfig.for_search(backend="triton-interpret", trials=2)) as real:
        judge = _TimedJudge(real)
        t0 = time.monotonic()
        summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
        took = time.monotonic() - t0
    # The best's final judgment ran into its grace beyond the limit, and no further.
    assert limit < took <= 1.10 * (1 + FINAL_GRACE_SHARE) * limit, took
    assert judge.finals >= 1 and summary.judged >= 2
    # Time was kept for the final judgments: the search stopped before the limit. Every search judgment that
    # finished left its step; final judgments leave none. (Whether a final cut off by the limit still counts in
    # ``judged`` depends on when the cut lands, so the bound is the count of judgments, finals or not.)
    steps = store.steps(run_id=summary.run_id)
    assert 2 <= len(steps) <= summary.judged
    rec = summary.best
    assert rec is not None and rec.status == "rejected", rec
    assert "final protocol" in summary.note and "rejected" in summary.note
    assert store.lookup(problem.key, h200()) is None  # never served


def test_final_reserve_counts_the_searches_that_share_the_judge() -> None:
    """Searches warmed side by side on one judge reach their final judgments together: each keeps time for one
    final judgment of its own plus the device time of every leader queued on the same device's timing lock, not as
    if it were alone."""
    from types import SimpleNamespace

    from ks_inductor.evolve.evolver import FINAL_COST, FINAL_HELD_COST, Evolver

    def estimate(parallel_regions):
        me = SimpleNamespace(search_s=[(2.0, 0.1)], judge=SimpleNamespace(device_count=4),
                             config=EvolveConfig(final_candidates=3, parallel_regions=parallel_regions))
        return Evolver._final_estimate(me)

    own, held = FINAL_COST * 2.0, FINAL_HELD_COST * 0.1
    assert estimate(None) == pytest.approx(own)  # 3 leaders over 4 devices: one each
    assert estimate(8) == pytest.approx(own + 5 * held)  # 24 leaders over 4 devices: 6 a device


def test_final_estimate_takes_the_judges_finished_final_judgments_over_the_search_s() -> None:
    """Once the judge has finished final judgments, their measured cost replaces the foresight from the search's
    (search children that queued long for the device do not inflate it: their waits are not their own time)."""
    from types import SimpleNamespace

    from ks_inductor.evolve.evolver import Evolver

    me = SimpleNamespace(search_s=[(2.0, 0.1)], judge=SimpleNamespace(device_count=1, typical_cost=lambda final: (
        (9.0, 3.0) if final else (2.0, 0.1))), config=EvolveConfig(final_candidates=3, parallel_regions=2))
    assert Evolver._final_estimate(me) == pytest.approx(9.0 + 5 * 3.0)


def test_the_judge_records_what_its_timed_judgments_cost_per_protocol() -> None:
    """``Judge.typical_cost``: a judgment's own seconds leave out its wait for the device and the reference."""
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as j:
        assert j.typical_cost(True) is None
        for wait in (1.0, 3.0, 5.0):
            res = EvalResult(verdict="accepted", correct=True, timings={"candidate": Timing(0.1, 0.0, 0.1, 5)},
                             stage_s={"device_wait": wait, "reference": 2.0}, device_held_s={"exclusive": 0.5})
            res.duration_s = 10.0 + wait
            j._record_cost(res, final=True)
        assert j.typical_cost(True) == pytest.approx((8.0, 0.5))
        assert j.typical_cost(False) is None


def test_the_reserve_keeps_time_for_the_best_alone_where_all_leaders_would_not_fit() -> None:
    """Where the final judgments of every leader would not fit in the largest reserve, the search keeps time for its
    best's alone (``_finish`` then judges only that one) rather than none; where they fit, it keeps their
    estimate."""
    from types import SimpleNamespace

    from ks_inductor.evolve.evolver import FINAL_COST, FINAL_HELD_COST, FINAL_RESERVE_MAX, Evolver

    def reserve(limit, own, held):
        me = SimpleNamespace(search_s=[(own, held)], timed=True, judge=SimpleNamespace(device_count=1),
                             config=EvolveConfig(final_candidates=3, time_limit_s=limit, parallel_regions=2))
        me._final_estimate = lambda leaders=None: Evolver._final_estimate(me, leaders)
        return Evolver._final_reserve(me)

    # 6 leaders of two searches on one device: one's own time and five others' device time, about 65 s, more than
    # half a 60 s limit: the best's alone (its own time and the other search's best's device time) is kept.
    assert reserve(60.0, 2.9, 0.4) == pytest.approx(FINAL_COST * 2.9 + FINAL_HELD_COST * 0.4)
    assert reserve(40.0, 2.9, 0.4) == pytest.approx(FINAL_RESERVE_MAX * 40.0)  # never more than that share
    assert reserve(200.0, 2.9, 0.4) == pytest.approx(FINAL_COST * 2.9 + 5 * FINAL_HELD_COST * 0.4)
