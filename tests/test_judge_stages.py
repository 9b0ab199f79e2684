"""Where a judgment's time goes: per-stage seconds on every verdict, summing to its wall time, kept through JSON."""

from __future__ import annotations

import json
import time

from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.judge.clock import STAGE_NAMES
from ks_inductor.judge.verdict import ERROR, EvalResult
from ks_inductor.problem_tracing import load_problem
from tests.conftest import CANDIDATES, PROBLEMS


def test_stages_are_reported_and_sum_to_the_judgment_wall_time() -> None:
    problem = load_problem(str(PROBLEMS / "rmsnorm.py"))
    source = (CANDIDATES / "rmsnorm_ok.py").read_text()
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        t0 = time.monotonic()
        first = judge.evaluate(problem, source)
        wall = time.monotonic() - t0
        second = judge.evaluate(problem, source)
    assert first.accepted, first.feedback_text()
    for stage in ("static", "reference", "worker_start", "load", "compile", "correctness", "checks", "compare",
                  "timing", "timing_checks", "teardown", "verdict"):
        assert stage in first.stage_s, (stage, first.stage_s)
    assert set(first.stage_s) <= set(STAGE_NAMES)
    assert abs(sum(first.stage_s.values()) - first.duration_s) < 0.05
    assert first.duration_s <= wall
    assert sum(first.stage_s.values()) > 0.9 * wall
    # The reference is computed once per problem: the second judgment finds it cached.
    assert second.stage_s["reference"] < 0.2 * first.stage_s["reference"]
    # The device was held shared for the correctness trials, for less than the judgment took.
    assert 0 < first.device_held_s["shared"] < first.duration_s
    back = EvalResult.from_json(json.loads(first.dumps()))
    assert back.stage_s == first.stage_s and back.device_held_s == first.device_held_s


def test_rows_from_before_stage_timing_still_load() -> None:
    row = EvalResult(verdict="accepted", correct=True).to_json()
    row.pop("stage_s")
    assert EvalResult.from_json(row).stage_s == {}


def test_a_judgment_past_its_deadline_is_an_error_not_a_verdict_on_the_candidate() -> None:
    problem = load_problem(str(PROBLEMS / "rmsnorm.py"))
    source = (CANDIDATES / "rmsnorm_ok.py").read_text()
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        t0 = time.monotonic()
        res = judge.evaluate(problem, source, deadline=time.monotonic() + 1.0)
        took = time.monotonic() - t0
        assert res.verdict == ERROR and res.error.startswith("deadline"), res.feedback_text()
        assert took < 3.0
        # A reference abandoned at the deadline is not remembered as broken.
        assert judge.evaluate(problem, source).accepted


def test_eval_shows_the_stages_as_a_table_and_in_json(capsys) -> None:
    from ks_inductor.cli import main

    args = ["eval", str(PROBLEMS / "rmsnorm.py"), str(CANDIDATES / "rmsnorm_ok.py"), "--backend", "triton-interpret",
            "--trials", "2"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"load", "compile", "correctness", "timing"} <= set(out["stage_s"])
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "judgment time" in text and "correctness" in text


def test_rep_ms_bounds_the_timing_loops_wall_time_flush_and_refresh_included() -> None:
    """A call's refresh and L2 flush cost more than a small kernel; ``rep_ms`` counts them, so a protocol's timing
    takes about what it says rather than the kernel's share of it times the calls (seconds for a 10 us kernel)."""
    from ks_inductor.judge.timing import benchmark_interleaved

    def refresh(_: int) -> None:
        time.sleep(0.002)  # a refresh and a flush that cost 2 ms a call

    t0 = time.monotonic()
    samples = benchmark_interleaved({"a": lambda: None, "b": lambda: None}, rounds=4, warmup_ms=0.0, rep_ms=40.0,
                                    min_reps=2, max_reps=1000, before_each=refresh, device="cpu")
    took = time.monotonic() - t0
    per_round = {name: [len(r) for r in rounds] for name, rounds in samples.items()}
    assert all(n <= 8 for rounds in per_round.values() for n in rounds), per_round  # ~40 / 4 / 2 = 5 a round
    assert took < 1.0, took


def test_search_children_skip_the_graph_timing_and_final_judgments_keep_it() -> None:
    config = JudgeConfig.for_search()
    assert config.protocol(final=False)["steady"] is False
    assert config.protocol(final=True)["steady"] is True
    assert JudgeConfig().protocol(final=False)["steady"] is True  # a plain judgment (eval) times it too
    assert JudgeConfig.for_search(steady_state=False).protocol(final=True)["steady"] is False


def test_prepare_computes_the_reference_before_any_judgment() -> None:
    """``Judge.prepare``: the reference's worker runs in the background (a search calls it before making its seeds),
    so that the first judgment finds it made; a problem whose reference fails reports it in the judgment."""
    problem = load_problem(str(PROBLEMS / "rmsnorm.py"))
    source = (CANDIDATES / "rmsnorm_ok.py").read_text()
    broken = problem.__class__(**{**problem.__dict__, "key": "broken-reference",
                                  "source": problem.source.replace("def forward(self", "def forward(self, *_,")
                                  .replace("return ", "raise RuntimeError('no reference'); return ", 1)})
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as judge:
        done = judge.prepare(problem)
        failed = judge.prepare(broken)
        done.result(timeout=120)
        failed.result(timeout=120)
        assert problem.key in judge._refs and not isinstance(judge._refs[problem.key], Exception)
        first = judge.evaluate(problem, source)
        bad = judge.evaluate(broken, source)
    assert first.accepted, first.feedback_text()
    assert first.stage_s["reference"] < 0.05
    assert bad.verdict == ERROR and "the reference failed" in (bad.error or ""), bad.error
