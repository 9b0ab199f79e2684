"""The candidate's process is isolated from the reference, from the judge and from every other candidate.

The candidates in ``tests/candidates/isolation/`` are judged with the static rules off, so that what stops them is
the isolation itself: a process that holds no reference model and no reference output, a sandbox that hides the
judge's scratch folder, an allow-list applied in the judge's own process, a thread watch below ``threading``, and a
fresh process for every candidate.
"""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

ISOLATION = CANDIDATES / "isolation"


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem_tracing import load_problem

    return load_problem(PROBLEMS / "rmsnorm.py")


@pytest.fixture(scope="module")
def judge():
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig(backend="triton-interpret", static_rules=False, compile_timeout_s=60, run_timeout_s=60)
    with Judge(cfg) as j:
        yield j


def _source(name: str) -> str:
    return (ISOLATION / name).read_text()


def test_a_global_forward_hook_finds_no_reference_outputs(judge, problem):
    r = judge.evaluate(problem, _source("hook_reference_outputs.py"))
    assert r.verdict == "rejected" and "mismatch" in r.flags, (r.flags, r.reasons)


def test_the_reference_outputs_on_disk_are_out_of_reach(judge, problem):
    r = judge.evaluate(problem, _source("reads_reference_files.py"))
    assert not r.correct, (r.verdict, r.flags, r.reasons)
    # With the sandbox in place the walk finds nothing to read (hidden folders do not list); without it the
    # reference's files sit in another folder of the same scratch root, and the verdict would be accepted.
    assert "found none of the reference's outputs" in (r.error or "") + " ".join(r.reasons), r.reasons


def test_an_allow_list_rebound_inside_the_worker_changes_nothing(judge, problem):
    r = judge.evaluate(problem, _source("widens_allow_list.py"))
    assert r.verdict == "rejected" and "torch_compute" in r.flags, (r.flags, r.reasons)


def test_torch_compute_on_a_raw_thread_is_flagged(judge, problem):
    r = judge.evaluate(problem, _source("raw_thread_compute.py"))
    assert r.verdict == "rejected" and "thread_injection" in r.flags, (r.flags, r.reasons)


@pytest.mark.parametrize("polluter,victim,flag", [("polluter_allow_list.py", "torch_compute_plain.py", "torch_compute"),
                                                   ("polluter_forward_hook.py", "noop_zeros.py", "mismatch")])
def test_a_candidate_in_a_search_cannot_change_the_verdict_of_the_next(problem, polluter, victim, flag):
    """As a search judges: one judge, candidates one after another. A polluter (an honest kernel that rigs its
    worker: an allow-list that lets every op through, a global hook handing out reference outputs) is judged right
    before the victim; the victim's verdict is the one it gets alone, and an honest candidate after both is
    accepted."""
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig.for_search(backend="triton-interpret", static_rules=False, compile_timeout_s=60,
                                 run_timeout_s=60)
    with Judge(cfg, max_workers=1) as judge:
        alone = judge.evaluate(problem, _source(victim))
        rigged = judge.evaluate(problem, _source(polluter))
        assert rigged.accepted, rigged.feedback_text()
        after = judge.evaluate(problem, _source(victim))
        last = judge.evaluate(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
    assert alone.verdict == "rejected" and flag in alone.flags, (alone.flags, alone.reasons)
    assert (after.verdict, sorted(after.flags)) == (alone.verdict, sorted(alone.flags)), after.reasons
    assert last.accepted, last.feedback_text()


def test_each_candidate_gets_its_own_draw_of_the_trials():
    """The reference runs every trial twice over (two draws); each candidate is checked on one draw per trial, picked
    at random, so candidates see different inputs while the reference ran once."""
    import random

    from ks_inductor.judge.service import _Reference

    ref = _Reference([{"seed": i} for i in range(10)], [], per_draw=5)

    picks = {tuple(ref.pick_trials(random.Random(s))) for s in range(20)}
    assert len(picks) > 1
    assert all(len(p) == 5 and all(k in (i, i + 5) for i, k in enumerate(p)) for p in picks)
    cut = _Reference([{"seed": i} for i in range(7)], [], per_draw=5)  # the disk kept 7 of 10
    assert all(k in (i, i + 5) and k < 7 for i, k in enumerate(cut.pick_trials(random.Random(1))))
