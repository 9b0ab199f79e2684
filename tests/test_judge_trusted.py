"""The trusted side runs, times and compares: exploits written against a judge whose evidence comes from a launch plan
that a process without candidate Python executes.

Each exploit in ``tests/candidates/trusted/`` attacks what the candidate's own process could still say or do: torch
compute behind doors the static rules do not see, timing forged or told apart by the call stack, caches in device
memory, state left in shared memory, a process that lies in every message. Each is judged twice, with the static
rules on and off: the plan is what stands, not a rule about names.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

TRUSTED = CANDIDATES / "trusted"
HONEST = CANDIDATES / "rmsnorm_ok.py"
STASH = "/dev/shm/kernelsmith-stash-test"

# exploit -> flags any of which its rejection may carry
REJECTED = {
    "builtins_door_compute.py": {"mismatch", "torch_compute"},
    "type_hints_door.py": {"mismatch", "torch_compute"},
    "lying_process_wrong.py": {"mismatch"},
    # its cache is made at its first call: the two recordings differ
    "device_cache.py": {"plan", "mismatch"},
    # a plan's tensors larger than the model's own need: refused before the judge copies them
    "oversized_state.py": {"plan"},
    # a claim of running out of device memory: judged once more alone, and rejected on that judgment
    "oom_claim.py": {"out_of_memory"},
}
# exploits whose forgery or trick buys nothing: judged exactly as their honest kernel is
NO_GAIN = ("forged_timing.py", "call_stack_partial.py", "lying_process.py", "host_hog.py")


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem_tracing import load_problem

    return load_problem(PROBLEMS / "rmsnorm.py")


@pytest.fixture(scope="module", params=[True, False], ids=["static-rules", "plan-alone"])
def verdicts(request, problem):
    from ks_inductor.judge import Judge, JudgeConfig

    cfg = JudgeConfig(backend="triton-interpret", static_rules=request.param, compile_timeout_s=40,
                      run_timeout_s=40)
    with Judge(cfg) as judge:
        names = [*REJECTED, *NO_GAIN]
        futures = {n: judge.submit(problem, (TRUSTED / n).read_text()) for n in names}
        futures["honest"] = judge.submit(problem, HONEST.read_text())
        yield request.param, {n: f.result() for n, f in futures.items()}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_exploits_against_the_plan_are_rejected(verdicts, name):
    static, got = verdicts
    r = got[name]
    assert r.verdict == "rejected" and not r.correct, r.feedback_text()
    assert r.reasons
    if not static:
        assert REJECTED[name] & set(r.flags), (r.flags, r.reasons)


def test_a_claim_of_running_out_of_memory_is_judged_again_once_and_stands(verdicts):
    """The retry alone is one judgment more, never a loop, and its verdict is the candidate's own."""
    _, got = verdicts
    r = got["oom_claim.py"]
    assert r.verdict == "rejected" and "out_of_memory" in r.flags, r.feedback_text()
    assert sum("judged alone" in n for n in r.notes) == 1, r.notes


@pytest.mark.parametrize("name", NO_GAIN)
def test_forgeries_buy_nothing(verdicts, name):
    """Rebound timers, a forward that does less when the judge's timing loop calls it, and a process that lies in
    every message: with the static rules off, each is judged as its honest kernel is, since no timed or checked call
    runs its Python; with them on, a door the rules know is refused before anything runs."""
    _, got = verdicts
    r, honest = got[name], got["honest"]
    assert honest.accepted, honest.feedback_text()
    if r.stage == "static":
        assert r.verdict == "rejected", r.feedback_text()
        return
    assert r.verdict == honest.verdict and r.correct == honest.correct, r.feedback_text()
    assert r.trials == honest.trials
    # Counted where the plan ran, not where the candidate said: every kernel once per call, as the honest one.
    assert set(r.launches.values()) == set(honest.launches.values())
    assert r.timings == honest.timings and r.speedup_eager == honest.speedup_eager


def _hogs() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() == b"ks-host-hog":
                    found.append(int(pid))
        except (OSError, ValueError):
            continue
    return found


def test_a_process_a_candidate_starts_ends_with_its_job(verdicts):
    """``host_hog.py`` forks children that try to leave the job's process group and spin for a minute: they stay in
    the group (the judge's seccomp filter), so the kill that ends the job ends them, long before their minute."""
    import time

    static, got = verdicts
    if got["host_hog.py"].stage == "static":
        pytest.skip("the static rules refuse the builtins door before the process runs")
    until = time.monotonic() + 10
    while _hogs() and time.monotonic() < until:
        time.sleep(0.2)
    assert not _hogs(), "a process started by a candidate outlived its job"


def test_a_lying_process_is_judged_by_its_plan(verdicts):
    _, got = verdicts
    liar = got["lying_process.py"]
    if liar.stage == "static":
        pytest.skip("the static rules refuse the protocol door before the process runs")
    assert "every trial passed" not in " ".join(liar.notes)
    assert liar.launches == {"_rmsnorm_kernel": liar.launches["_rmsnorm_kernel"]}
    assert liar.launches["_rmsnorm_kernel"] != 99


def test_record_job_holds_no_seed(problem, monkeypatch):
    """The candidate's process gets no seed of the judgment: trials, timing sets and their order are only in the
    trusted job."""
    from ks_inductor.judge import Judge, JudgeConfig, service

    jobs: list[dict] = []
    original = service.Judge._run

    def spy(self, job, *args, **kwargs):
        jobs.append(json.loads(json.dumps(job)))
        return original(self, job, *args, **kwargs)

    monkeypatch.setattr(service.Judge, "_run", spy)
    with Judge(JudgeConfig(backend="triton-interpret", trials=2, seed=7), spares=False) as judge:
        r = judge.evaluate(problem, HONEST.read_text())
    assert r.accepted, r.feedback_text()
    record = [j for j in jobs if j["kind"] == "record"]
    plan = [j for j in jobs if j["kind"] == "plan"]
    assert len(record) == 1 and len(plan) == 1
    assert not {"trials", "timing_sets", "order_seed"} & set(record[0])
    # Nor can it derive one from the init seed it is given (the weights' seed): the inputs' seeds come from a secret
    # of their own, not from offsets of that seed.
    seeds = [s for s, _ in plan[0]["trials"] + plan[0]["timing_sets"]]
    assert all(abs(s - record[0]["init_seed"]) > 10**6 for s in seeds), (record[0]["init_seed"], seeds)
    assert plan[0]["trials"] and plan[0]["timing_sets"]
    assert record[0]["workdir"] != plan[0]["workdir"]


def test_shared_memory_stash_reaches_no_later_candidate(problem):
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.sandbox import landlock_abi

    if os.path.exists(STASH):
        os.remove(STASH)
    cfg = JudgeConfig(backend="triton-interpret", static_rules=False, trials=2)
    with Judge(cfg, spares=False) as judge:
        writer = judge.evaluate(problem, (TRUSTED / "shm_stash_writer.py").read_text())
        reader = judge.evaluate(problem, (TRUSTED / "shm_stash_reader.py").read_text())
    try:
        if landlock_abi() > 0:
            assert not os.path.exists(STASH)
            assert writer.verdict == "rejected", writer.feedback_text()
        assert reader.verdict == "rejected" and not reader.correct, reader.feedback_text()
    finally:
        if os.path.exists(STASH):
            os.remove(STASH)


def test_heavy_tailed_outputs_hide_no_element():
    """Outputs spread over 26 orders of magnitude: a kernel that writes 0 for the smaller 58% of them is wrong,
    however small those elements are next to the output's typical magnitude; the honest kernel passes."""
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    heavy = load_problem(PROBLEMS / "heavy_tail.py")
    with Judge(JudgeConfig(backend="triton-interpret", trials=2), spares=False) as judge:
        ok = judge.evaluate(heavy, (CANDIDATES / "heavy_tail_ok.py").read_text())
        zeros = judge.evaluate(heavy, (TRUSTED / "heavy_tail_zeros.py").read_text())
    assert ok.accepted, ok.feedback_text()
    assert zeros.verdict == "rejected" and "mismatch" in zeros.flags, zeros.feedback_text()
    assert zeros.mismatch.fraction_mismatched > 0.5


def test_loose_share_counts_only_elements_passing_through_the_scale():
    """The compare rule itself: a few elements that pass only through the output's scale (sums that cancel) are
    fine; past LOOSE_SHARE of the output they are wrong."""
    import torch

    from ks_inductor.judge.compare import LOOSE_SHARE, compare_outputs

    tol = lambda dtype: (1e-4, 1e-4)  # noqa: E731
    ref = torch.logspace(0, 26, 4096, dtype=torch.float64).float().view(64, 64)
    few = ref.clone()
    few.view(-1)[: int(LOOSE_SHARE * ref.numel()) // 2] += 0.5
    assert compare_outputs([ref], [few], tol, 0, "normal") == (None, None)
    many = ref.clone()
    many.view(-1)[: int(0.58 * ref.numel())] = 0
    m, why = compare_outputs([ref], [many], tol, 0, "normal")
    assert why and m.fraction_mismatched > 0.5
