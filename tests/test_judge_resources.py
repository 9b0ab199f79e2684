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


def test_a_job_too_large_to_share_the_device_waits_for_the_jobs_in_flight(judge) -> None:
    """KernelBench's 16 GiB avg pool runs the H200 out of memory when three of its jobs overlap: a job
    whose working set is a large share of the device runs alone. The gate is held here as a job in flight holds it."""
    import time

    from ks_inductor.judge.admission import input_bytes, runs_alone
    from ks_inductor.problem import load_problem
    from tests.conftest import CANDIDATES, PROBLEMS

    gib = 2**30
    assert runs_alone(16 * gib, 2 * gib, int(139.8 * gib))  # 45: 16 GiB in, 2 GiB out, on an H200
    assert not runs_alone(32 * 2**20, 32 * 2**20, int(139.8 * gib))  # a serving norm
    assert not runs_alone(16 * gib, 16 * gib, 0)  # no size known: nothing is held back
    # The baselines' job holds its three timing sets at once: an 8 GiB reduction's (the sum of KernelBench level 1)
    # runs alone, where a candidate's job of it shares the device.
    assert not runs_alone(8 * gib, 0, int(139.8 * gib)) and runs_alone(8 * gib, 0, int(139.8 * gib), hold=6)

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    src = (CANDIDATES / "rmsnorm_ok.py").read_text()
    assert input_bytes(problem.input_specs) > 0
    gate = judge._pool.job_gates[None]
    device_bytes = judge._device_bytes
    try:
        # At its true size this problem shares the host: a job in flight does not hold it back.
        gate.acquire("shared")
        try:
            assert judge.submit(problem, src).result(timeout=300).accepted
        finally:
            gate.release("shared")
        # On a device of a few bytes the same problem is large: it waits until the job in flight has ended.
        judge._device_bytes = 64
        gate.acquire("shared")
        try:
            fut = judge.submit(problem, src)
            time.sleep(4.0)
            assert not fut.done()
        finally:
            gate.release("shared")
        assert fut.result(timeout=300).accepted
    finally:
        judge._device_bytes = device_bytes
