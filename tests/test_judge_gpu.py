"""The judge on a real GPU (triton-cuda or triton-maca): timing, baselines and the side-stream exploit."""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem_tracing import load_problem

    return load_problem(PROBLEMS / "rmsnorm_bf16.py")


def test_honest_kernel_is_timed_against_both_baselines(problem):
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(rounds=5, rep_ms=100)) as judge:
        r = judge.evaluate(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
    assert r.correct and r.verdict in ("accepted", "quarantined"), r.feedback_text()
    assert r.timing_meaningful and {"candidate", "eager", "inductor"} <= set(r.timings)
    assert r.speedup_eager and r.speedup_eager_lcb <= r.speedup_eager
    assert r.roofline_fraction and 0 < r.roofline_fraction < 1.2
    # And inside a CUDA graph, every tool over cold inputs: the score weighs both.
    assert {"candidate", "eager", "inductor"} <= set(r.steady_timings)
    assert set(r.steady_speedups) == {"eager", "inductor"}
    assert all(r.steady_speedup_lcbs[k] <= v for k, v in r.steady_speedups.items())
    assert r.score == pytest.approx((r.speedup_best * min(r.steady_speedups.values())) ** 0.5)


@pytest.mark.parametrize("name,flag", [("host_sync.py", "graph_capture")])
def test_what_only_a_cuda_graph_shows_is_caught_without_static_rules(problem, name, flag):
    """A candidate that syncs with the host cannot be captured, so it cannot be served: its process's capture of the
    forward fails. (One that does other work only while captured is judged by its plan, which the trusted side
    captures itself; its source is refused by the static rules, ``capture_aware``.)"""
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(rounds=2, rep_ms=30, static_rules=False, baselines=("eager",))) as judge:
        r = judge.evaluate(problem, (CANDIDATES / "exploits" / name).read_text())
    assert r.verdict == "rejected" and flag in r.flags, r.feedback_text()


def test_work_on_a_side_stream_is_timed_in_full_without_static_rules(problem):
    """A forward that launches on a stream of its own hides its work from events on the timed stream, were it run
    as written. The trusted side launches the recorded plan on its own stream: the side stream's kernels are timed
    as the same kernels launched in plain sight."""
    from ks_inductor.judge import Judge, JudgeConfig

    hidden = (CANDIDATES / "exploits" / "side_stream.py").read_text()
    plain = hidden.replace("with torch.cuda.stream(self.side):", "if True:")
    assert plain != hidden
    with Judge(JudgeConfig(rounds=3, rep_ms=50, static_rules=False, baselines=("eager",))) as judge:
        got = judge.evaluate(problem, hidden)
        seen = judge.evaluate(problem, plain)
    assert seen.accepted and seen.timings, seen.feedback_text()
    if got.accepted:
        # The least of each's samples: the same plan's median moved 1.8x between two judgments a few seconds apart.
        assert got.timings["candidate"].min_ms > 0.8 * seen.timings["candidate"].min_ms, (
            got.feedback_text(), seen.feedback_text())
    else:
        assert "side_stream" in got.flags or "graph_capture" in got.flags, got.feedback_text()


def test_flush_leaves_no_dirty_lines_for_the_timed_call():
    """The judge's flush reads a second buffer after zeroing the first, so a copy of 32 MiB is not charged for
    writing back the flush's lines: it runs faster than after the zeroing alone (21.4 against 18.8 us on the H200)."""
    import torch

    from ks_inductor.judge import timing as T

    a = torch.randint(0, 100, (16 * 2**20,), dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    fns = {"dirty": lambda: b.copy_(a), "clean": lambda: b.copy_(a)}
    flushes = {"dirty": T.make_l2_flush("cuda", clean=False), "clean": T.make_l2_flush("cuda")}
    med = {}
    for name, fn in fns.items():
        s = T.benchmark_interleaved({name: fn}, rounds=3, rep_ms=30, flush=flushes[name])
        med[name] = T.summarize(s[name]).median_ms
    assert med["clean"] < 0.97 * med["dirty"], med


def test_a_call_the_host_is_slow_to_launch_is_timed_on_the_device():
    """Eight tiny kernels with a host pause between launches: behind the first spin the GPU reaches the start event
    before the host has launched them all, and would time the pauses. The call is timed again behind longer spins
    until the host is ahead, and measures what the same launches take in a CUDA graph, not the host's 2 ms."""
    import time

    import torch

    from ks_inductor.judge import timing as T

    x = torch.zeros(1024, device="cuda")

    def slow_host() -> None:
        for _ in range(8):
            x.add_(1.0)
            time.sleep(0.00025)

    leads: dict = {}
    s = T.benchmark_interleaved({"slow_host": slow_host}, rounds=3, rep_ms=30, leads=leads)
    per_call = T.summarize(s["slow_host"]).median_ms
    graphed, errors = T.benchmark_graphed({"slow_host": [lambda: [x.add_(1.0) for _ in range(8)]]}, rounds=3)
    assert not errors
    in_graph = T.summarize(graphed["slow_host"]).median_ms
    assert leads["slow_host"].retimed > 0 and leads["slow_host"].behind == 0, leads["slow_host"]
    assert leads["slow_host"].cycles > T.LEAD_CYCLES
    assert per_call < 0.5, (per_call, in_graph)  # the host took over 2 ms to launch each call
    assert per_call < 4 * in_graph + 0.02, (per_call, in_graph)


def test_graphed_timing_is_per_call_and_reports_what_cannot_be_captured():
    import torch

    from ks_inductor.judge import timing as T

    sets = [torch.randn(8 * 2**20, device="cuda") for _ in range(T.cold_set_count(32 * 2**20, 60 * 2**20))]
    outs = [torch.empty_like(x) for x in sets]
    calls = {"copy": [(lambda x=x, y=y: y.copy_(x)) for x, y in zip(sets, outs)],
             "synced": [(lambda x=x: x.sum().item()) for x in sets]}
    samples, errors = T.benchmark_graphed(calls, rounds=3, replays=4)
    assert set(samples) == {"copy"} and "synced" in errors
    assert len(samples["copy"]) == 3 and all(len(r) == 4 for r in samples["copy"])
    per_call_us = T.summarize(samples["copy"]).median_ms * 1e3
    assert 2 * 32 * 2**20 / (per_call_us * 1e-6) < 6e12  # no more than HBM3e can move: the calls were not elided
    assert per_call_us > 1.0
    assert torch.equal(outs[0], sets[0])
    # The failed capture leaves the process's random draws on the device working (torch leaves its generator marked
    # as capturing after a capture that fails).
    assert torch.randn(4, device="cuda").isfinite().all()


def test_candidates_judged_apart_share_one_timing_of_the_baselines(problem):
    """Each candidate runs in a process of its own; the baselines are timed once by a trusted worker and serve every
    judgment of the problem, so two candidates' figures compare directly."""
    from ks_inductor.judge import Judge, JudgeConfig

    honest = (CANDIDATES / "rmsnorm_ok.py").read_text()
    launch = "        _rmsnorm_kernel[(x2.shape[0],)](x2, self.weight, out, n, self.eps, BLOCK=triton.next_power_of_2(n))\n"
    assert launch in honest
    twice = honest.replace(launch, launch + launch)  # the same kernel launched twice per call
    with Judge(JudgeConfig(rounds=5, rep_ms=100)) as judge:
        once, double = (judge.evaluate(problem, src, final=True) for src in (honest, twice))
    for r in (once, double):
        assert r.correct and r.timing_meaningful, r.feedback_text()
        assert set(r.timings) == {"candidate", "eager", "inductor"} and set(r.steady_speedups) == {"eager", "inductor"}
    assert once.timings["eager"] == double.timings["eager"] and once.timings["inductor"] == double.timings["inductor"]
    # Launched twice it takes about twice as long, per call and in a graph (less where the second pass finds its
    # input in L2).
    assert double.candidate_ms / once.candidate_ms > 1.4
    assert double.steady_timings["candidate"].median_ms / once.steady_timings["candidate"].median_ms > 1.4
