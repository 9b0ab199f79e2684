"""The judge's own limits are not a candidate's fault: a worker that reports its scratch disk full (the trial
outputs it keeps to compare them) gives an error verdict that says what to change, never a rejection."""

from __future__ import annotations

from ks_inductor.judge.pool import JobOutcome


def test_a_full_scratch_disk_is_an_error_of_the_judge_not_a_rejection(judge) -> None:
    res = judge._new_result("def f(): pass", "k")
    # The message a worker sends when saving a trial's outputs hits ENOSPC (as on the H200 with KernelBench's
    # 8 GiB outputs).
    sent = {"event": "result", "ok": False, "oom": False, "device_error": False, "no_space": True,
            "error": "SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)"}
    assert judge._absorb_outcome(res, JobOutcome(result=sent, stage="correctness")) is False
    assert res.verdict == "error" and not res.accepted
    assert res.error.startswith("judge resources:") and "TMPDIR" in res.error and "os error 28" in res.error
    assert not any(f in res.flags for f in ("correctness_error", "out_of_memory"))

    # Without the flag the same failure stays the candidate's: rejected with its stage's flag.
    other = judge._new_result("def f(): pass", "k")
    judge._absorb_outcome(other, JobOutcome(result={**sent, "no_space": False}, stage="correctness"))
    assert other.verdict == "rejected" and "correctness_error" in other.flags


def test_jobs_share_a_device_while_the_memory_they_hold_fits() -> None:
    """Four jobs of a 4.3 GB max pool held 17-33 GiB each and ran an H200 out of memory beside the reference's and
    the baselines' jobs: each job is admitted by what it holds, first come first served."""
    import threading
    import time

    from ks_inductor.judge.admission import ALONE, MemoryGate, job_bytes

    gib = 2**30
    pool_in, pool_out = 4_294_967_296, 503_316_480  # KernelBench's 3-D max pool, fp32
    plan = job_bytes("plan", pool_in, pool_out, 3)
    assert 28 * gib < plan < 40 * gib  # what such a worker was seen to hold, and a little more
    assert job_bytes("plan", 32 * 2**20, 32 * 2**20, 4) < 2 * gib  # a serving norm: the worker's own memory
    assert job_bytes("reference", gib, None, 3) == job_bytes("reference", gib, gib, 3)  # outputs unknown: as inputs

    gate = MemoryGate(int(0.85 * 139.8 * gib))
    held = [gate.acquire(plan) for _ in range(3)]
    assert gate.running == 3
    started = threading.Event()

    def fourth() -> None:
        taken = gate.acquire(plan)
        started.set()
        gate.release(taken)

    t = threading.Thread(target=fourth)
    t.start()
    time.sleep(0.3)
    assert not started.is_set()  # a fourth does not fit beside three
    gate.release(held.pop())
    assert started.wait(5)
    t.join()

    # A job larger than the device runs alone, and the jobs behind it wait their turn (first come, first served).
    order: list[str] = []
    big_taken: list[int] = []

    def big() -> None:
        big_taken.append(gate.acquire(ALONE))
        order.append("big")

    def small() -> None:
        taken = gate.acquire(gib)
        order.append("small")
        gate.release(taken)

    tb = threading.Thread(target=big)
    tb.start()
    time.sleep(0.2)
    ts = threading.Thread(target=small)
    ts.start()
    time.sleep(0.3)
    assert order == []  # the big job waits for the two running; the small one waits behind it
    for taken in held:
        gate.release(taken)
    tb.join(5)
    time.sleep(0.2)
    assert order == ["big"]  # the small one does not start beside a job that runs alone
    gate.release(big_taken[0])
    ts.join(5)
    assert order == ["big", "small"] and gate.running == 0 and gate.used == 0

    unknown = MemoryGate(0)  # no size known: nothing is held back
    assert [unknown.acquire(ALONE), unknown.acquire(ALONE)] == [0, 0] and unknown.running == 2


def test_a_job_too_large_for_the_device_waits_for_the_jobs_in_flight(judge) -> None:
    """Through the judge: at its true size a problem's jobs share the host with a job in flight; on a device of a
    few bytes the same problem's jobs wait until the job in flight has ended."""
    import time

    from ks_inductor.problem_tracing import load_problem
    from tests.conftest import CANDIDATES, PROBLEMS

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    src = (CANDIDATES / "rmsnorm_ok.py").read_text()
    gate = judge._pool.job_gates[None]
    capacity = gate.capacity
    try:
        taken = gate.acquire(2**20)
        try:
            assert judge.submit(problem, src).result(timeout=300).accepted
        finally:
            gate.release(taken)
        gate.capacity = 64
        taken = gate.acquire(1)
        try:
            fut = judge.submit(problem, src)
            time.sleep(4.0)
            assert not fut.done()
        finally:
            gate.release(taken)
        assert fut.result(timeout=300).accepted
    finally:
        gate.capacity = capacity


def test_a_candidate_out_of_device_memory_beside_other_jobs_is_judged_again_alone(judge) -> None:
    """Running out of memory beside other jobs may be their doing: the candidate is judged again alone, and only
    then is the failure its own."""
    from ks_inductor.problem_tracing import load_problem
    from tests.conftest import PROBLEMS

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    src = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        if x.numel() > 0:
            raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB")
        y = torch.empty_like(x)
        _copy[(1,)](x, y, x.numel(), BLOCK=16)
        return y
'''
    res = judge.evaluate(problem, src)
    assert res.verdict == "rejected" and "out_of_memory" in res.flags, res.feedback_text()
    assert any("judged alone" in n for n in res.notes), res.notes
