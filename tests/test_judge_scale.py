"""Outputs that scale could fool: a problem whose few huge outputs overflow fp32 norms and dwarf the rest, judged end
to end. A kernel that computes only the huge ones and writes zeros elsewhere is rejected; an honest one passes."""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS


@pytest.fixture(scope="module")
def judge():
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig(backend="triton-interpret", compile_timeout_s=40, run_timeout_s=40, memory_limit_mb=3000)
    with Judge(cfg, spares=False) as j:
        yield j


@pytest.fixture(scope="module")
def verdicts(judge):
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEMS / "huge_outputs.py")
    futures = {"zeros": judge.submit(problem, (CANDIDATES / "exploits" / "overflow_zeros.py").read_text()),
               "honest": judge.submit(problem, (CANDIDATES / "huge_outputs_ok.py").read_text())}
    return {name: f.result() for name, f in futures.items()}


def test_zeros_beside_huge_outputs_are_a_mismatch(verdicts):
    r = verdicts["zeros"]
    assert r.verdict == "rejected" and not r.correct and "mismatch" in r.flags, r.feedback_text()
    m = r.mismatch
    assert m is not None and m.first_bad_index is not None
    # Every element of the 252 features it skipped is wrong, whatever the 1e30 ones did to the norms.
    assert m.fraction_mismatched > 0.9, m
    assert m.atol < 1e-2, m


def test_an_honest_kernel_for_huge_outputs_is_accepted(verdicts):
    r = verdicts["honest"]
    assert r.accepted and r.correct and r.trials == 5, r.feedback_text()
