"""Limits that hold: ``time_limit_s`` bounds a whole ``evolve_problem`` call on the interpreter judge (the judge's
start, the search, what is in flight at the end, the cache writes and the judge's stop), and the final protocol
that cannot run in what is left leaves the search's best unverified, never served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.judge.verdict import DEADLINE_ERROR, EvalResult, Timing
from tests.test_evolve_families import small_problem

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

    def submit(self, problem, source, timing=None, final=False, rivals=None, deadline=None):
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
    assert took <= 1.10 * limit, took
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
    """Searches warmed side by side on one judge reach their final judgments together: each keeps time for its
    leaders' share of every device's timing lock with theirs, not as if it were alone."""
    from types import SimpleNamespace

    from ks_inductor.evolve.evolver import FINAL_COST, Evolver

    def estimate(parallel_regions):
        me = SimpleNamespace(search_s=[2.0], judge=SimpleNamespace(device_count=4),
                             config=EvolveConfig(final_candidates=3, parallel_regions=parallel_regions))
        return Evolver._final_estimate(me)

    assert estimate(None) == FINAL_COST * 2.0 * 1  # 3 leaders over 4 devices: one each
    assert estimate(8) == FINAL_COST * 2.0 * 6  # 24 leaders over 4 devices


def test_no_final_reserve_where_the_final_judgments_could_not_start() -> None:
    """Where even the largest reserve could not start the final judgments (they take longer than the whole limit
    here), the search keeps none and uses the whole limit; where they fit, it keeps their estimate."""
    from types import SimpleNamespace

    from ks_inductor.evolve.evolver import FINAL_COST, Evolver

    def reserve(limit, search_s):
        me = SimpleNamespace(search_s=[search_s], timed=True, judge=SimpleNamespace(device_count=1),
                             config=EvolveConfig(final_candidates=3, time_limit_s=limit))
        me._final_estimate = lambda: Evolver._final_estimate(me)
        return Evolver._final_reserve(me)

    # 3 leaders on one device at 2.9 s per search judgment: about 26 s, more than a 24.4 s limit.
    assert reserve(24.4, 2.9) == 0.0
    assert reserve(100.0, 2.9) == FINAL_COST * 2.9 * 3
