"""Problems, canonical keys, fingerprints, backend detection, timing statistics and the plausibility gate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import PROBLEMS, ROOT
from tests.speed import judge_speed

LINEAR_A = """
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, n, m):
        super().__init__()
        self.lin = nn.Linear(n, m)
    def forward(self, x):
        return torch.relu(self.lin(x))
def get_inputs():
    return [torch.randn(8, {n})]
def get_init_inputs():
    return [{n}, 16]
"""

LINEAR_B = """
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def __init__(self, n, m):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(m, n))
        self.bias = nn.Parameter(torch.randn(m))
    def forward(self, x):
        return F.relu(F.linear(x, self.weight, self.bias))
def get_inputs():
    return [torch.rand(8, {n})]
def get_init_inputs():
    return [{n}, 16]
"""


def test_two_spellings_share_a_key_and_shapes_change_it():
    from ks_inductor.problem_tracing import problem_from_source

    a = problem_from_source(LINEAR_A.format(n=32), "a")
    b = problem_from_source(LINEAR_B.format(n=32), "b")
    assert a.key == b.key
    c = problem_from_source(LINEAR_A.format(n=64), "c")
    assert c.key != a.key
    half = problem_from_source(LINEAR_A.format(n=32).replace("torch.randn(8, 32)", "torch.randn(8, 32).half()"), "h")
    assert half.key != a.key
    assert a.op_summary.get("addmm") == 1 and a.op_summary.get("relu") == 1
    assert a.flops == 2 * 8 * 32 * 16  # the matmul FLOPs from the flop counter
    assert a.bytes_moved == 4 * (8 * 32 + 16 * 32 + 16 + 8 * 16)


def test_constant_spelling_does_not_change_the_key():
    from ks_inductor.problem_tracing import problem_from_source

    src = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x * {c}
def get_inputs():
    return [torch.randn(4, 4)]
"""
    assert problem_from_source(src.format(c="2.0"), "a").key == problem_from_source(src.format(c="2."), "b").key
    assert problem_from_source(src.format(c="2.0"), "a").key != problem_from_source(src.format(c="2.5"), "b").key


def test_problem_from_callable_renders_kernelbench_source_with_the_same_key():
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import problem_from_callable, problem_from_source

    def fn(x, w):
        return torch.softmax(x @ w, dim=-1)

    x, w = torch.randn(4, 8), torch.randn(8, 6)
    p = problem_from_callable(fn, [x, w], "region")
    mod = exec_problem_source(p.source)
    out = mod.Model()(x, w)
    assert torch.allclose(out, fn(x, w), atol=1e-6)
    assert problem_from_source(p.source, "again").key == p.key
    assert [s.shape for s in p.input_specs] == [[4, 8], [8, 6]]


def test_problem_json_round_trip():
    from ks_core.problem_record import Problem
    from ks_inductor.problem_tracing import load_problem

    p = load_problem(PROBLEMS / "rmsnorm.py")
    q = Problem.from_json(json.loads(json.dumps(p.to_json())))
    assert q == p


def test_missing_and_malformed_problems_are_clear_errors(tmp_path):
    from ks_core.problem_record import ProblemError
    from ks_inductor.problem_tracing import load_problem

    with pytest.raises(ProblemError, match="not found"):
        load_problem(tmp_path / "nope.py")
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(ProblemError, match="syntax error"):
        load_problem(bad)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ProblemError, match="missing Model"):
        load_problem(empty)


def _fp(**kw):
    from ks_core.fingerprint import EnvFingerprint

    base = dict(backend="cuda", device_name="NVIDIA H200", capability="sm_90", warp_size=32, sm_count=132,
                torch_version="2.11.0+cu130", triton_version="3.6.0", toolchain="cuda-13.0")
    base.update(kw)
    return EnvFingerprint(**base)


def test_fingerprint_match_rule():
    from ks_core.fingerprint import match

    here = _fp()
    assert match(_fp(torch_version="2.11.1+cu130"), here) == "exact"
    assert match(_fp(torch_version="2.12.0+cu130"), here) == "reverify"
    assert match(_fp(triton_version="3.7.0"), here) == "reverify"
    assert match(_fp(device_name="NVIDIA H100 80GB HBM3", sm_count=132), here) == "none"
    assert match(_fp(backend="cpu-interpret"), here) == "none"


def test_maca_detection_and_fingerprints_never_collide_with_nvidia():
    from ks_inductor.judge.backends import (
        BackendUnavailable,
        PlatformProbe,
        backend_for,
        is_maca,
        select_backend_name,
    )

    nvidia = PlatformProbe(cuda_available=True, device_count=1, torch_version="2.11.0+cu130",
                           device_names=["NVIDIA H200"], triton_target_backend="cuda")
    assert not is_maca(nvidia)
    assert select_backend_name(None, nvidia) == "triton-cuda"
    for probe in (
        PlatformProbe(cuda_available=True, torch_version_maca="3.5.3.9", torch_version="2.8.0"),
        PlatformProbe(cuda_available=True, torch_version="2.8.0+metax3.5.3.9"),
        PlatformProbe(cuda_available=True, triton_target_backend="maca"),
        PlatformProbe(cuda_available=True, mx_smi_path="/opt/mxdriver/bin/mx-smi"),
        PlatformProbe(cuda_available=True, device_names=["MetaX C500"]),
    ):
        assert is_maca(probe)
        assert select_backend_name(None, probe) == "triton-maca"
        with pytest.raises(BackendUnavailable, match="MetaX"):
            select_backend_name("triton-cuda", probe)
    maca = backend_for("triton-maca")
    assert maca.warp_size == 64 and maca.fingerprint_backend == "maca" and maca.timed
    cpu = PlatformProbe()
    assert select_backend_name(None, cpu) == "triton-interpret"
    with pytest.raises(BackendUnavailable, match="needs a GPU"):
        select_backend_name("triton-cuda", cpu)
    # A C500 reports sm_80 like an A100; the fingerprints still differ in backend, capability and warp size.
    from ks_core.fingerprint import match

    a100 = _fp(device_name="NVIDIA A100-SXM4-80GB", capability="sm_80", sm_count=108)
    c500 = _fp(backend="maca", device_name="MetaX C500", capability="maca:8.0", warp_size=64, sm_count=104)
    assert a100.hardware_id != c500.hardware_id and match(a100, c500) == "none"


def test_worker_environment_pins_devices_and_interpreter():
    from ks_inductor.judge.backends import backend_for, worker_environment

    env = worker_environment(backend_for("triton-interpret"), None)
    assert env["TRITON_INTERPRET"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
    env = worker_environment(backend_for("triton-maca"), 3)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["MACA_VISIBLE_DEVICES"] == "3"


def test_timing_statistics_and_lower_bound():
    from ks_inductor.judge.timing import ratio_with_lcb, summarize

    ref = [[2.0, 2.1, 1.9, 2.0] for _ in range(7)]
    fast = [[1.0, 1.05, 0.95, 1.0] for _ in range(7)]
    t = summarize(fast)
    assert t.median_ms == pytest.approx(1.0) and t.n == 28 and t.min_ms == 0.95
    ratio, lcb = ratio_with_lcb(ref, fast)
    assert ratio == pytest.approx(2.0) and 1.8 < lcb <= ratio
    noisy = [[1.0, 3.0, 0.5, 2.5] for _ in range(7)]
    r2, lcb2 = ratio_with_lcb(ref, noisy)
    assert lcb2 < r2 and lcb2 < 1.03  # noise must not decide: no claimed win


def test_interpreter_timing_loop_runs_the_rotation():
    from ks_inductor.judge.timing import benchmark_interleaved

    seen = []
    samples = benchmark_interleaved({"a": lambda: sum(range(100)), "b": lambda: None}, rounds=3, warmup_ms=0,
                                    rep_ms=0, min_reps=2, max_reps=2, before_each=seen.append, device="cpu")
    assert len(samples["a"]) == 3 and all(len(r) == 2 for r in samples["a"])
    assert len(seen) > 12 and len(set(seen)) == len(seen)  # every call gets fresh (rotated) inputs


def test_graphed_timing_cycles_through_enough_input_sets_to_miss_the_l2():
    from ks_inductor.judge.timing import cold_set_count

    l2 = 60 * 2**20
    for set_bytes in (1, 2**20, 32 * 2**20, 61 * 2**20, 16 * l2 - 1):
        n = cold_set_count(set_bytes, l2)
        assert n >= 2 and n * set_bytes >= 4 * l2
    assert cold_set_count(32 * 2**20, l2) == 8  # and no more than it takes
    # A set of 16 L2s or more is cold on its own: one set, not two copies of KernelBench's 8.6 GB tensors.
    assert cold_set_count(16 * l2, l2) == 1 and cold_set_count(8 * 2**30, l2) == 1


def test_steady_state_timing_is_skipped_with_a_note_where_device_memory_cannot_hold_it():
    from ks_inductor.judge import EvalResult, Judge, JudgeConfig
    from ks_inductor.judge.timing import cold_set_count, steady_state_bytes
    from ks_inductor.problem_tracing import load_problem

    l2, gib = 60 * 2**20, 2**30
    h200_share = int(0.8 * 139.8 * gib)
    # KernelBench's avg pool 2d: 16 GiB in and out, two rotating sets, three tools. Its graphs alone would take more
    # than a worker's share of an H200, before the 48 GiB the per-call timing holds.
    big = steady_state_bytes(16 * gib, 16 * gib, cold_set_count(32 * gib, l2), 2, 3)
    assert big > h200_share - 48 * gib
    # A 4096x4096 bf16 norm: eight cold sets, a few hundred MiB.
    small = steady_state_bytes(32 * 2**20, 32 * 2**20, cold_set_count(64 * 2**20, l2), 3, 3)
    assert small < 2 * gib and small > cold_set_count(64 * 2**20, l2) * 4 * 32 * 2**20

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    per_call = {"eager": [[1.0] * 5] * 5, "inductor": [[0.6] * 5] * 5, "candidate": [[0.3] * 5] * 5}
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        judge.backend.timed = True  # synthetic GPU samples
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": per_call, "wall": None, "steady_skipped": "needs 140 GiB"})
        assert r.verdict == "accepted" and r.faster and not r.steady_timings
        assert any("steady state not timed: needs 140 GiB" in n for n in r.notes)


def test_plausibility_gate_quarantines_implausible_speed():
    from ks_inductor.judge import EvalResult, Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        judge.backend.timed = True  # feed the gate synthetic GPU samples
        base = {"eager": [[1.0] * 5] * 5, "inductor": [[0.6] * 5] * 5}
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**base, "candidate": [[0.05] * 5] * 5}, "wall": None})
        assert r.verdict == "quarantined" and "implausible_speedup" in r.flags
        r = EvalResult(correct=True, verdict="accepted")  # 11x over a slow eager, 2.2x over Inductor: plausible
        judge_speed(judge, r, problem, {"samples": {"eager": [[1.0] * 5] * 5, "inductor": [[0.2] * 5] * 5,
                                                    "candidate": [[0.09] * 5] * 5}, "wall": None})
        assert r.verdict == "accepted" and r.speedup_eager > 10
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**base, "candidate": [[0.3] * 5] * 5}, "wall": None})
        assert r.verdict == "accepted" and r.faster and r.speedup_inductor == pytest.approx(2.0)
        # With a roofline floor (0.05 ms at this bandwidth) the floor decides: 12.5x over a lone eager baseline
        # is plausible above it, and anything below it is held.
        bandwidth = problem.bytes_moved / 0.05e-3
        eager_only = {"eager": [[1.0] * 5] * 5}
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**eager_only, "candidate": [[0.08] * 5] * 5}, "wall": None,
                                        "bandwidth": bandwidth})
        assert r.verdict == "accepted" and r.speedup_eager > 12 and r.roofline_fraction == pytest.approx(0.625)
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**eager_only, "candidate": [[0.03] * 5] * 5}, "wall": None,
                                        "bandwidth": bandwidth})
        assert r.verdict == "quarantined" and r.flags == ["faster_than_roofline"]
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**base, "candidate": [[0.3] * 5] * 5},
                                        "wall": {"hidden_ms": 2.0, "overhead_ms": 0.02}})
        assert r.verdict == "rejected" and "side_stream" in r.flags
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {**base, "candidate": [[0.59] * 5] * 5}, "wall": None})
        assert r.verdict == "accepted" and not r.faster  # 2% is inside the 3% margin


def test_a_launch_bound_kernel_not_slower_on_the_device_is_left_to_the_serving_race():
    """A decode-step norm's device time is a few launches; whether it pays is decided on the host, where a stack's
    race at load time times the call as served. The judge marks it so rather than rejecting it outright."""
    from ks_inductor.judge import EvalResult, Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEMS / "rmsnorm.py")

    def judged(cand_ms: float, launch_ms: float) -> EvalResult:
        per_call = {"eager": [[0.0105] * 5] * 5, "inductor": [[0.0101] * 5] * 5, "candidate": [[cand_ms] * 5] * 5}
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": per_call, "wall": None, "launch_ms": launch_ms})
        return r

    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        judge.backend.timed = True  # synthetic GPU samples
        r = judged(0.0100, 0.004)
        assert r.launch_bound and not r.faster and r.served_by_race
        assert EvalResult.from_json(json.loads(r.dumps())).served_by_race
        assert not judged(0.0103, 0.004).served_by_race  # slower than Inductor on the device
        r = judged(0.0100, 0.0001)  # a hundred launches: its device time is what it costs
        assert not r.launch_bound and not r.served_by_race
        r = judged(0.0050, 0.004)  # faster by the margin: verified, not left to a race
        assert r.faster and not r.served_by_race


def test_cuda_graph_timing_enters_the_score_and_the_serving_decision():
    from ks_inductor.judge import EvalResult, Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    per_call = {"eager": [[1.0] * 5] * 5, "inductor": [[0.6] * 5] * 5, "candidate": [[0.3] * 5] * 5}
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        judge.backend.timed = True  # synthetic GPU samples
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": per_call, "wall": None})
        assert r.faster and r.score == r.speedup_best == pytest.approx(2.0) and not r.steady_timings
        # 2x per call, but slower than Inductor inside a CUDA graph: never served, and ranked by both.
        steady = {"eager": [[0.8] * 5] * 5, "inductor": [[0.4] * 5] * 5, "candidate": [[0.5] * 5] * 5}
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": per_call, "steady_samples": steady, "wall": None})
        assert r.steady_speedups == pytest.approx({"eager": 1.6, "inductor": 0.8})
        assert not r.faster and r.verdict == "accepted"
        assert r.score == pytest.approx((2.0 * 0.8) ** 0.5) and r.score_lcb <= r.score
        steady["candidate"] = [[0.35] * 5] * 5
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": per_call, "steady_samples": steady, "wall": None})
        assert r.faster and r.score == pytest.approx((2.0 * 0.4 / 0.35) ** 0.5)
        back = EvalResult.from_json(json.loads(r.dumps()))
        assert back.steady_timings["candidate"].median_ms == pytest.approx(0.35) and back.score == r.score
        assert "Inside a CUDA graph" in r.feedback_text()
        # The roofline gate holds for the graph's time too.
        r = EvalResult(correct=True, verdict="accepted")
        judge_speed(judge, r, problem, {"samples": {"eager": [[1.0] * 5] * 5, "candidate": [[0.3] * 5] * 5},
                                        "steady_samples": {"eager": [[1.0] * 5] * 5,
                                                           "candidate": [[0.01] * 5] * 5},
                                        "wall": None, "bandwidth": problem.bytes_moved / 0.05e-3})
        assert r.verdict == "quarantined" and "faster_than_roofline" in r.flags


def test_where_the_deployment_launches_each_call_the_cuda_graph_timing_is_kept_and_does_not_decide():
    """A stack that launches each call on its own (transformers' generate) pays a call's cost as made; a kernel
    faster per call by the margin and slower inside a CUDA graph is faster there, and the graph figures stay in the
    verdict. Where kernels run inside CUDA graphs (the default), the same samples are not faster."""
    from ks_inductor.judge import EvalResult, Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEMS / "rmsnorm.py")
    # Decode attention as a pack build times it: 1.10x eager per call, 0.98x inside a CUDA graph.
    per_call = {"eager": [[0.0110] * 5] * 5, "candidate": [[0.0100] * 5] * 5}
    steady = {"eager": [[0.0098] * 5] * 5, "candidate": [[0.0100] * 5] * 5}
    verdicts = {}
    for in_graphs in (True, False):
        with Judge(JudgeConfig(backend="triton-interpret", in_graphs=in_graphs), spares=False) as judge:
            judge.backend.timed = True  # synthetic GPU samples
            r = EvalResult(correct=True, verdict="accepted")
            judge_speed(judge, r, problem, {"samples": per_call, "steady_samples": steady, "wall": None,
                                            "launch_ms": 0.004})
            verdicts[in_graphs] = r
    graphed, per_call_only = verdicts[True], verdicts[False]
    assert not graphed.faster and not graphed.served_by_race and "in a CUDA graph" in graphed.not_faster
    assert per_call_only.faster and per_call_only.not_faster == "" and not per_call_only.in_graphs
    assert per_call_only.steady_speedups == pytest.approx({"eager": 0.98})
    back = EvalResult.from_json(json.loads(per_call_only.dumps()))
    assert not back.in_graphs and not back.graph_slower
    # Not faster by the margin per call, and slower in a graph that does not decide: left to the stack's race.
    tie = EvalResult.from_json({**json.loads(per_call_only.dumps()), "faster": False, "speedup_eager_lcb": 1.01})
    assert tie.served_by_race and "in a CUDA graph" not in tie.speed_why(0.03)
    # A cache shared by both kinds of run keeps each verdict to the rule it was reached by: a resumed search does
    # not take the other rule's decision as its own (an untimed verdict decides nothing on speed).
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.evolver import same_rules

    assert same_rules(graphed, EvolveConfig()) and not same_rules(graphed, EvolveConfig(in_graphs=False))
    assert same_rules(back, EvolveConfig(in_graphs=False)) and not same_rules(back, EvolveConfig())
    assert same_rules(EvalResult(correct=True, verdict="accepted"), EvolveConfig(in_graphs=False))


def test_eval_cli_json_and_exit_codes():
    cmd = [sys.executable, "-m", "ks_inductor.cli", "eval", str(PROBLEMS / "rmsnorm.py")]
    ok = subprocess.run(cmd + [str(ROOT / "tests/candidates/rmsnorm_ok.py"), "--backend", "triton-interpret",
                               "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["correct"] is True and data["stage"] == "done" and data["flags"] == [] and data["error"] is None
    bad = subprocess.run(cmd + [str(ROOT / "tests/candidates/exploits/try_except_fallback.py"), "--json",
                                "--backend", "triton-interpret"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["flags"] == ["try_except_fallback"]
    usage = subprocess.run(cmd + ["/nonexistent.py", "--json"], capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and json.loads(usage.stdout)["ok"] is False


def test_in_place_ops_on_intermediates_are_functionalized_before_keying():
    import torch

    from ks_inductor.problem_tracing import problem_from_callable, trace_aten

    def in_place(x):
        y = x * 2
        y.add_(1)
        return y

    x = torch.randn(4, 8)
    assert problem_from_callable(in_place, [x]).key == problem_from_callable(lambda t: t * 2 + 1, [x]).key
    gm = trace_aten(lambda t, w: torch.nn.functional.rms_norm(t, (8,), w, 1e-6), x, torch.randn(8))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.rsqrt.default" in targets and not any(t.split(".")[1].endswith("_") for t in targets)


def test_search_and_final_protocols():
    from ks_inductor.judge import JudgeConfig

    search = JudgeConfig.for_search(backend="triton-cuda")
    # A search's children are timed against both baselines (timed once per problem): it aims at the faster, and
    # the two give the region's room.
    assert search.protocol(False) == {"rounds": 5, "rep_ms": 60.0, "max_reps": 100, "warmup_ms": 10.0,
                                      "baselines": ["eager", "inductor"], "steady": False, "peers": {}}
    assert search.protocol(True) == {"rounds": 7, "rep_ms": 200.0, "max_reps": 2000, "warmup_ms": 25.0,
                                     "baselines": ["eager", "inductor"], "steady": True, "peers": {}}
    assert JudgeConfig(steady_state=False).protocol(True)["steady"] is False
    assert JudgeConfig().protocol(False)["baselines"] == ["eager", "inductor"]


def test_vectorized_bootstrap_matches_the_loop():
    import random

    from ks_inductor.judge.timing import ratio_with_lcb

    rng = random.Random(3)
    ref = [[2 + rng.gauss(0, 0.3) for _ in range(40)] for _ in range(7)]
    cand = [[1 + rng.gauss(0, 0.3) for _ in range(40)] for _ in range(7)]
    ratio, lcb_vec = ratio_with_lcb(ref, cand)  # equal-length rounds: the vectorized path
    ragged = [r[:-1] if i == 0 else r for i, r in enumerate(cand)]  # one short round: the loop
    _, lcb_loop = ratio_with_lcb(ref, ragged)
    assert lcb_vec < ratio and abs(lcb_vec - lcb_loop) < 0.05


def test_a_test_run_writes_only_into_one_folder_it_removes(tmp_path):
    """TMPDIR, Triton's cache, Ray's sessions and the kernelsmith home of a test run all lie in one folder, gone
    when the run ends."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os, tempfile\n"
        "def test_write():\n"
        "    paths = [tempfile.mkdtemp(prefix='ks-judge-'), os.environ['TRITON_CACHE_DIR'],\n"
        "             os.environ['RAY_TMPDIR'], os.environ['KERNELSMITH_HOME']]\n"
        "    for p in paths:\n"
        "        os.makedirs(p, exist_ok=True)\n"
        "        open(os.path.join(p, 'x'), 'w').close()\n"
        "    print('PATHS', os.environ['KERNELSMITH_TEST_RUN_DIR'], *paths)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELSMITH_TEST_RUN_DIR", "TMPDIR", "TRITON_CACHE_DIR", "RAY_TMPDIR", "KERNELSMITH_HOME",
                        "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "tests.conftest",
                          str(probe)], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (line,) = [ln for ln in out.stdout.splitlines() if "PATHS" in ln]
    run_dir, *paths = line.split("PATHS ", 1)[1].split()
    assert all(Path(p).is_relative_to(run_dir) for p in paths), (run_dir, paths)
    assert Path(run_dir).parent == tmp_path and not Path(run_dir).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_probe.py"]
