"""The judge keeps the reference's outputs of every trial on its scratch disk. Where they would not fit (KernelBench's
8.6 GB outputs on a 64 GiB disk), it runs fewer trials and timing sets, and the verdict says so."""

from __future__ import annotations

from collections import namedtuple

from ks_inductor.judge.scratch import fit_trials, shortfall_note
from tests.conftest import CANDIDATES, PROBLEMS

GiB = 2**30


def test_small_outputs_keep_every_trial() -> None:
    f = fit_trials(64 * 2**20, 5, 3, 50 * GiB, in_flight=6)
    assert (f.trials, f.sets, f.fits) == (5, 3, True)
    assert shortfall_note(f.trials, 5, f.sets, 3, 64 * 2**20, 50 * GiB) == ""


def test_large_outputs_give_up_timing_sets_first_then_trials() -> None:
    out = int(8.6 * 2**30)  # KernelBench level 1, 39: L2Norm over 32768 x 65535 fp32
    # 55 GiB free, 0.8 of it usable: 44 GiB, five outputs of 8.6 GB with one candidate output in flight.
    f = fit_trials(out, 5, 3, 55 * GiB, in_flight=1)
    assert (f.trials, f.sets, f.fits) == (2, 2, True)
    assert (f.trials + f.sets + 1) * out <= 0.8 * 55 * GiB < (f.trials + 1 + f.sets + 1) * out
    # With 70 GiB free a third trial fits; a third timing set would come only after all five trials.
    assert fit_trials(out, 5, 3, 70 * GiB, in_flight=1).trials == 3
    note = shortfall_note(f.trials, 5, f.sets, 3, out, 55 * GiB)
    assert "2 of 5 correctness trials" in note and "2 of 3 timing input sets" in note and "TMPDIR" in note
    # Never below one trial and two sets; if even that does not fit, it says so (the judge then tries it).
    tiny = fit_trials(out, 5, 3, 10 * GiB, in_flight=6)
    assert (tiny.trials, tiny.sets, tiny.fits) == (1, 2, False)


def test_a_judge_short_of_disk_runs_fewer_trials_and_says_so(monkeypatch) -> None:
    """The real judge, with the operating system reporting a nearly full scratch disk: the reference keeps one trial
    and two timing sets, a correct candidate is still accepted on them, and the verdict carries the note."""
    from ks_inductor.judge import Judge, JudgeConfig, service
    from ks_inductor.problem_tracing import load_problem

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(service.shutil, "disk_usage", lambda p: usage(GiB, GiB, 0))
    problem = load_problem(PROBLEMS / "rmsnorm.py")
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as j:
        r = j.evaluate(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
        assert r.accepted, r.feedback_text()
        assert r.trials == 1, r.trials
        assert any("1 of 5 correctness trials and 2 of 3 timing input sets" in n for n in r.notes), r.notes
        assert "Judge's note: fewer checks for lack of scratch disk" in r.feedback_text()
        # The reference was planned once for the problem; a second judgment reuses it and its note.
        again = j.evaluate(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
        assert again.trials == 1 and again.notes == r.notes
