"""The judge's own limits are not a candidate's fault: a worker that reports its scratch disk full (the trial
outputs it keeps to compare them) gives an error verdict that says what to change, never a rejection."""

from __future__ import annotations

from ks_inductor.judge.pool import JobOutcome


def test_a_full_scratch_disk_is_an_error_of_the_judge_not_a_rejection(judge) -> None:
    res = judge._new_result("def f(): pass", "k")
    # The message a worker sends when saving a trial's outputs hits ENOSPC (as on the H200 with KernelBench's
    # 8 GiB outputs, session 20).
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
