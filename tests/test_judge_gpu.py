"""The judge on a real GPU (triton-cuda or triton-maca): timing, baselines and the side-stream exploit."""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem import load_problem

    return load_problem(PROBLEMS / "rmsnorm_bf16.py")


def test_honest_kernel_is_timed_against_both_baselines(problem):
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(rounds=5, rep_ms=100)) as judge:
        r = judge.evaluate(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
    assert r.correct and r.verdict in ("accepted", "quarantined"), r.feedback_text()
    assert r.timing_meaningful and {"candidate", "eager", "inductor"} <= set(r.timings)
    assert r.speedup_eager and r.speedup_eager_lcb <= r.speedup_eager
    assert r.roofline_fraction and 0 < r.roofline_fraction < 1.2


def test_side_stream_is_caught_by_the_wall_clock_even_without_static_rules(problem):
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(rounds=3, rep_ms=50, static_rules=False, baselines=("eager",))) as judge:
        r = judge.evaluate(problem, (CANDIDATES / "exploits" / "side_stream.py").read_text())
    assert r.verdict == "rejected" and "side_stream" in r.flags, r.feedback_text()
