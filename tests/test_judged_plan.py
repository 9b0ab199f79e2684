"""Serving launches a pack kernel as the judge ran it: at its problem's signature, the launch plan its verdict was
reached with, with its Triton kernels built from its source, and never its Python forward
(``ks_inductor.judged_plan``). A forward that is honest while it is recorded and wrong later has nothing to act on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from integrations.signature import spec_signature
from integrations.transformers import apply_kernelsmith
from kernel_cache.pack import export_pack, inspect_pack, read_pack
from kernel_cache.record import VERIFIED, KernelRecord
from kernel_cache.store import KernelStore
from tests.llama_norm import (  # noqa: F401 - the autouse fixtures
    _no_serving_env,
    _transformers,
    build_norm_pack,
    hidden,
    norm_layer,
    own_output,
)

SLEEPER = Path(__file__).parent / "candidates" / "serving" / "sleeper_rmsnorm.py"
SLEEPER_CONST = Path(__file__).parent / "candidates" / "serving" / "sleeper_rmsnorm_const.py"
TRACING = Path(__file__).parent / "candidates" / "serving" / "tracing_rmsnorm.py"
SLEEPER_STATE = Path(__file__).parent / "candidates" / "serving" / "sleeper_rmsnorm_state.py"
COUNTING_CONST = Path(__file__).parent / "candidates" / "serving" / "counting_rmsnorm_const.py"
COUNTING_PAST = Path(__file__).parent / "candidates" / "serving" / "counting_rmsnorm_past_constant.py"


@pytest.fixture(scope="module")
def norm_problem(tmp_path_factory, judge):
    """LlamaRMSNorm's problem at (2, 8, 64) float32, as a pack build traces it (its key is what the layer asks)."""
    root = tmp_path_factory.mktemp("judged")
    build_norm_pack(root, judge)
    with KernelStore(str(root / "k.db")) as store:
        [problem] = store.problems()
        [found] = store.kernels(problem.key)
    # The search's kernel carries the plan its verdict was reached with.
    assert found.plan and '"op": "launch"' in found.plan
    return problem


def _pack(tmp_path: Path, problem, judge, source: str, plan: str) -> Path:
    res = judge.evaluate(problem, source)
    assert res.accepted, res.feedback_text()
    assert (res.plan or plan != "judged") and "plan" not in res.to_json()
    with KernelStore(str(tmp_path / "s.db")) as store:
        store.upsert_problem(problem)
        store.add_kernel(KernelRecord(problem_key=problem.key, source=source, backend=judge.fingerprint.backend,
                                      fingerprint=judge.fingerprint.to_json(), status=VERIFIED, timed=False,
                                      trials=res.trials, plan=res.plan if plan == "judged" else ""))
        export_pack(store, tmp_path / "s.kspack")
    return tmp_path / "s.kspack"


def _served_calls(pack: Path, calls: int = 12) -> tuple[int, dict, object]:
    """The layer with ``pack`` applied, called ``calls`` times: how many outputs were wrong, the guard's statistics
    and the report."""
    norm = norm_layer()
    report = apply_kernelsmith(norm, pack)
    x = hidden()
    want = own_output(norm, x)
    with torch.no_grad():
        wrong = sum(not torch.allclose(norm(x), want, atol=1e-5, rtol=1e-5) for _ in range(calls))
    return wrong, report.stats(), report


def test_a_forward_that_turns_wrong_after_its_judgment_never_runs_where_the_judged_plan_serves(
        norm_problem, judge, tmp_path):
    pack = _pack(tmp_path, norm_problem, judge, SLEEPER.read_text(), "judged")
    wrong, stats, report = _served_calls(pack)
    assert wrong == 0
    assert stats["hits"] == {"rmsnorm": 12}, stats
    assert list(stats["judged"].values()) == [["judged plan"]]
    assert [k["judged_plan"] for k in inspect_pack(pack).manifest["kernels"]] == [True]
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert kernel.loaded is None  # its module, forward included, was never imported here


def test_without_a_judged_plan_a_kernel_never_serves_and_its_forward_never_runs(norm_problem, judge, tmp_path):
    """The same kernel stored without its plan (as before plans were kept): its forward is the candidate's own
    Python, which the judge never ran, so it does not serve; the layer computes every call, and the kernel's module
    is never imported."""
    pack = _pack(tmp_path, norm_problem, judge, SLEEPER.read_text(), "none")
    wrong, stats, report = _served_calls(pack)
    assert wrong == 0 and stats["hits"] == {}, stats
    assert list(stats["judged"].values()) == [["its record carries no judged plan"]]
    assert stats["kernels"] == {norm_problem.key[:12]: ["failed"]}
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert "only a judged plan serves" in kernel.note and kernel.loaded is None
    assert [k["judged_plan"] for k in inspect_pack(pack).manifest["kernels"]] == [False]


def test_a_call_its_judged_plan_declines_is_computed_by_the_stack_never_by_the_forward(norm_problem, judge,
                                                                                       tmp_path):
    """An input at the judged signature that starts past its storage's first element is one the judged plan
    declines. The sleeper's forward would turn wrong there past its count; the stack's own layer computes every such
    call instead, each counted."""
    from integrations.serving import R_DECLINED

    pack = _pack(tmp_path, norm_problem, judge, SLEEPER.read_text(), "judged")
    norm = norm_layer()
    report = apply_kernelsmith(norm, pack)
    x = hidden()
    shifted = torch.cat([torch.zeros(1), x.flatten()])[1:].view_as(x)
    assert shifted.storage_offset() == 1 and shifted.stride() == x.stride()
    want = own_output(norm, shifted)
    with torch.no_grad():
        wrong = sum(not torch.allclose(norm(shifted), want, atol=1e-5, rtol=1e-5) for _ in range(12))
        assert torch.allclose(norm(x), own_output(norm, x), atol=1e-5, rtol=1e-5)
    assert wrong == 0
    stats = report.stats()
    assert stats["fallbacks"] == {"rmsnorm": {R_DECLINED: 12}} and stats["hits"] == {"rmsnorm": 1}, stats
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert kernel.loaded is None  # the forward was never imported


def test_a_forward_that_makes_a_constant_is_still_served_from_its_judged_plan(norm_problem, judge, tmp_path):
    """The sleeper again, whose forward also makes a tensor from host data: the judge records it as a constant of
    the plan, and the stored plan carries the constant's bytes, so serving still runs the judged plan (a plan that
    could not carry them would leave the forward to serve, and it turns wrong)."""
    source = SLEEPER_CONST.read_text()
    pack = _pack(tmp_path, norm_problem, judge, source, "judged")
    [rec] = read_pack(pack, None)[1].kernels
    assert '"kind": "const"' in rec.plan and '"payload"' in rec.plan
    wrong, stats, report = _served_calls(pack)
    assert wrong == 0 and stats["hits"] == {"rmsnorm": 12}, stats
    assert list(stats["judged"].values()) == [["judged plan"]]
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert kernel.loaded is None


def test_a_kernel_that_counts_its_calls_in_a_constant_starts_every_call_from_the_recorded_bytes(
        norm_problem, judge, tmp_path):
    """The exploit: no Python of it runs after its recording, but its kernel counts its calls in a constant the
    plan carries and turns wrong past 40. The judge runs the plan a few times and finds it right; a served plan runs
    it far more often. A plan's constants are written back to their recorded bytes before every call, so each call
    starts where the judged ones did: 80 served calls, none wrong (43 were before)."""
    pack = _pack(tmp_path, norm_problem, judge, COUNTING_CONST.read_text(), "judged")
    wrong, stats, _ = _served_calls(pack, calls=80)
    assert wrong == 0 and stats["hits"] == {"rmsnorm": 80}, stats
    assert list(stats["judged"].values()) == [["judged plan"]]


def test_a_kernel_that_holds_tensors_of_its_own_is_stored_without_a_plan_and_never_serves(norm_problem, judge,
                                                                                           tmp_path):
    """The sleeper again, holding a tensor of its own as a plain attribute: the plan reads the model's own state, so
    the judge stores none, and its forward would turn wrong if it served. Without a judged plan a pack kernel does
    not serve; the stack's own layer does, and the kernel's module is never imported."""
    source = SLEEPER_STATE.read_text()
    res = judge.evaluate(norm_problem, source)
    assert res.accepted and res.plan == "", res.feedback_text()
    pack = _pack(tmp_path, norm_problem, judge, source, "none")
    wrong, stats, report = _served_calls(pack)
    assert wrong == 0 and stats["hits"] == {}, stats
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert "carries no judged plan" in kernel.note and kernel.loaded is None, kernel.note


def test_a_plan_without_its_constants_bytes_is_refused(norm_problem, judge):
    """A constant's bytes are part of the plan: a stored plan that lacks them does not run, and says why."""
    import json

    from ks_inductor.judged_plan import plan_fault

    source = SLEEPER_CONST.read_text()
    res = judge.evaluate(norm_problem, source)
    assert res.accepted and res.plan
    stripped = json.loads(res.plan)
    stripped.pop("payload")
    assert plan_fault(res.plan, source, 2) == ""
    assert "without the 4 bytes of its constant" in plan_fault(json.dumps(stripped), source, 2)


def test_a_judged_plan_that_names_a_kernel_the_source_lacks_is_not_served(norm_problem, judge, tmp_path):
    """A plan is checked against the source it came with: a plan naming a kernel that is not one of the source's
    does not run, and the kernel does not serve (its forward is never the stand-in), saying why."""
    from integrations.checks import PackKernel, load_kernel
    from ks_inductor.judge.plan import Plan

    source = SLEEPER.read_text()
    res = judge.evaluate(norm_problem, source)
    plan = Plan.from_json(res.plan)
    for step in plan.steps:
        step["kernel"] = "_not_in_the_source"
    rec = KernelRecord(problem_key=norm_problem.key, source=source, backend="cpu-interpret", fingerprint={},
                       plan=plan.to_json())
    kernel = PackKernel(rec, norm_problem, None)
    why = load_kernel(kernel)
    assert "_not_in_the_source" in why and "only a judged plan serves" in why
    assert kernel.judged is None and kernel.loaded is None


def test_the_plan_declines_a_call_off_its_signature_or_offset_into_its_storage(norm_problem, judge):
    """The plan's views fit the judged signature's tensors where they start their storages: a call at another
    signature, or whose input starts further in, is declined (the caller computes it its own way: the stack, or the region's reference)."""
    from ks_inductor.judged_plan import JudgedPlan

    source = SLEEPER.read_text()
    res = judge.evaluate(norm_problem, source)
    rec = KernelRecord(problem_key=norm_problem.key, source=source, backend="cpu-interpret", fingerprint={},
                       plan=res.plan)
    plan = JudgedPlan(rec, spec_signature(norm_problem.input_specs))
    x, w = hidden(), norm_layer().weight.detach()
    assert plan(x, w) is not None
    shifted = torch.cat([torch.zeros(1), x.flatten()])[1:].view_as(x)
    assert shifted.storage_offset() == 1 and plan(shifted, w) is None
    # and any other signature: another length, another layout
    assert plan(x[:, :4].contiguous(), w) is None
    assert plan(x.transpose(0, 1).contiguous().transpose(0, 1), w) is None


@pytest.mark.gpu
def test_on_a_gpu_the_judged_plan_is_what_torchs_static_launcher_replays(norm_problem, judge):
    """A plan names kernels, grids and arguments, not a device: the interpreter's judged plan runs compiled on a
    GPU, and the served call's launch plan is recorded from it (not from the forward) and launched by torch's static
    launcher, with the same outputs as the stack's own computation."""
    from integrations.launch_plan import make_plan
    from ks_inductor.judged_plan import JudgedPlan

    source = SLEEPER.read_text()
    res = judge.evaluate(norm_problem, source)
    rec = KernelRecord(problem_key=norm_problem.key, source=source, backend="cpu-interpret", fingerprint={},
                       plan=res.plan)
    judged = JudgedPlan(rec, spec_signature(norm_problem.input_specs))
    norm = norm_layer().cuda()
    x, w = hidden().cuda(), norm.weight.detach()
    want = own_output(norm, x)
    torch.testing.assert_close(judged(x, w), want, atol=1e-5, rtol=1e-5)
    plan, why = make_plan(judged, [x, w])
    assert plan is not None, why
    assert plan.launcher() == "static"
    for _ in range(8):  # past the forward's count: the forward never runs, so nothing changes
        torch.testing.assert_close(plan(x, w), want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_on_a_gpu_a_count_kept_past_a_constant_does_not_survive_its_write_back(norm_problem, judge):
    """The exploit against the write-back: the count also kept 512 bytes past the constant, where a device-side copy
    of the recorded bytes would sit. The bytes written back come from the host, so 80 calls of the judged plan on
    the GPU are all right. Judged on the GPU: its write past the constant means device memory, which under the
    interpreter would be the judge's host heap."""
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judged_plan import JudgedPlan

    source = COUNTING_PAST.read_text()
    with Judge(JudgeConfig(backend="triton-cuda", trials=3)) as gpu_judge:
        res = gpu_judge.evaluate(norm_problem, source)
    assert res.accepted and res.plan, res.feedback_text()
    rec = KernelRecord(problem_key=norm_problem.key, source=source, backend="cuda", fingerprint={},
                       plan=res.plan)
    judged = JudgedPlan(rec, spec_signature(norm_problem.input_specs))
    norm = norm_layer().cuda()
    x, w = hidden().cuda(), norm.weight.detach()
    want = own_output(norm, x)
    wrong = sum(not torch.allclose(judged(x, w), want, atol=1e-5, rtol=1e-5) for _ in range(80))
    assert wrong == 0


class _NormThenLinear(torch.nn.Module):
    """A compiled model whose norm region takes (x, w): the region the sleeper is judged and cached for."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w
        return self.lin(h)


def _compiled_calls(tmp_path: Path, judge, plan: str) -> tuple[int, str]:
    """The sleeper cached for the model's norm region (with its judged plan, or without), the model compiled with
    kernelsmith and called 12 times: how many outputs were wrong, and how the norm region was served."""
    from ks_inductor.compiler import backend as B
    from tests.cached_kernels import norm_key

    torch._dynamo.reset()
    B.clear_reports()
    torch.manual_seed(0)
    model, x = _NormThenLinear().eval(), torch.randn(4, 16)
    db = f"sqlite:///{tmp_path / plan}.db"
    key, seen = norm_key(model, x, db)
    [problem] = [p for p in seen.problems if p.key == key]
    source = SLEEPER.read_text()
    res = judge.evaluate(problem, source)
    assert res.accepted and res.plan, res.feedback_text()
    with KernelStore(db) as store:
        store.upsert_problem(problem)
        store.add_kernel(KernelRecord(problem_key=problem.key, source=source, backend=judge.fingerprint.backend,
                                      fingerprint=B.current_fingerprint().to_json(), status=VERIFIED, timed=False,
                                      trials=res.trials, plan=res.plan if plan == "judged" else ""))
    B.forget_stores()
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db, "compile_threads": 1})
    with torch.no_grad():
        want = model(x)
        wrong = sum(not torch.allclose(compiled(x), want, atol=1e-5, rtol=1e-5) for _ in range(12))
    statuses = {r.status for rep in B.compile_reports() for r in rep.regions if r.key == problem.key}
    torch._dynamo.reset()
    B.forget_stores()
    return wrong, ",".join(sorted(statuses))


def test_a_compiled_models_cached_kernel_runs_its_judged_plan_not_its_forward(judge, tmp_path):
    """The compile backend's op for a cached kernel runs the kernel's judged plan at the region's signature: the
    sleeper serves the compiled model right on every call. Cached without its plan, it is not served at all (its
    forward would go wrong once its count is past): Inductor computes the region."""
    wrong, status = _compiled_calls(tmp_path, judge, "judged")
    assert status == "hit" and wrong == 0
    wrong, status = _compiled_calls(tmp_path, judge, "none")
    assert status == "unusable" and wrong == 0


def _judged(problem, judge, source: str, plan: str | None = None):
    """The kernel of ``source``, judged for ``problem``, as a record with its judged plan (or ``plan``), and that
    plan ready to run."""
    from ks_inductor.judged_plan import JudgedPlan

    res = judge.evaluate(problem, source)
    assert res.accepted and res.plan, res.feedback_text()
    rec = KernelRecord(problem_key=problem.key, source=source, backend=judge.fingerprint.backend, fingerprint={},
                       plan=plan or res.plan)
    return rec, JudgedPlan(rec, spec_signature(problem.input_specs))


def test_a_triton_op_runs_the_judged_plan_it_traces(norm_problem, judge):
    """A triton_op's function is what a compile traces into the graph: it is the judged plan, built of views of one
    tensor per storage and launches through ``wrap_triton``, and it computes the layer. (The interpreter cannot be
    traced; ``test_on_a_gpu_a_compiled_graph_traces_the_judged_plan_never_the_forward`` compiles it.)"""
    from ks_inductor.compiler.kernel_ops import OpSpec, register_region_op, served_kernel

    rec, judged = _judged(norm_problem, judge, TRACING.read_text())
    norm = norm_layer()
    x, w = hidden(), norm.weight.detach()
    want = own_output(norm, x)
    assert judged.untraceable([x, w]) == ""
    op = register_region_op(served_kernel(rec), norm_problem.key, lambda x, w: own_output(norm, x),
                            OpSpec(["Tensor", "Tensor"], 1, [torch.float32]), triton=True, judged=judged)
    torch.testing.assert_close(op(x, w), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(judged.traced(x, w), want, atol=1e-5, rtol=1e-5)


def test_a_custom_op_computes_a_call_its_judged_plan_declines_with_the_regions_reference(norm_problem, judge):
    """A compiled graph's custom_op runs the judged plan; a call the plan declines (an input past its storage's
    start) is the region's reference's, never the sleeper's forward, which would turn wrong past its count."""
    from ks_inductor.compiler.kernel_ops import OpSpec, register_region_op, served_kernel

    rec, judged = _judged(norm_problem, judge, SLEEPER.read_text())
    norm = norm_layer()
    reference_calls = []

    def reference(x, w):
        reference_calls.append(1)
        return own_output(norm, x)

    op = register_region_op(served_kernel(rec), norm_problem.key, reference,
                            OpSpec(["Tensor", "Tensor"], 1, [torch.float32]), judged=judged)
    x, w = hidden(), norm.weight.detach()
    shifted = torch.cat([torch.zeros(1), x.flatten()])[1:].view_as(x)
    want = own_output(norm, shifted)
    wrong = sum(not torch.allclose(op(shifted, w), want, atol=1e-5, rtol=1e-5) for _ in range(12))
    assert wrong == 0 and len(reference_calls) == 12
    torch.testing.assert_close(op(x, w), own_output(norm, x), atol=1e-5, rtol=1e-5)
    assert len(reference_calls) == 12  # at the judged layout the plan serves


def test_a_traced_plans_kernels_write_its_buffers_not_views_of_them(norm_problem, judge, monkeypatch):
    """Traced, a launch that writes a view of a buffer becomes the kernel on a copy and a scatter back into the
    buffer (extra kernels on every call of the compiled graph). The traced plan allocates each buffer in the layout of
    its first view, so the kernel writes the buffer itself: the graph is the allocation, the kernel and its output."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ks_inductor.judged_plan import JudgedPlan

    rec, _ = _judged(norm_problem, judge, TRACING.read_text())
    # Traced (on meta tensors), the kernels are compiled ones, as on a GPU; the interpreter's cannot be traced.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for name in [m for m in sys.modules if m.startswith("ks_judged")]:
        monkeypatch.delitem(sys.modules, name)  # the interpreted kernels module of the same source
    judged = JudgedPlan(rec, spec_signature(norm_problem.input_specs))
    ins = [torch.empty(shape, dtype=dt, device="meta") for shape, dt, _ in judged.signature]
    assert judged.untraceable(ins) == ""
    graph = make_fx(torch.func.functionalize(judged.traced), tracing_mode="fake")(*ins)
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert any("triton_kernel_wrapper_functional" in o for o in ops), ops
    assert not any("scatter" in o or "as_strided" in o for o in ops), ops


def test_what_a_triton_op_does_not_trace(norm_problem, judge):
    """Off the judged signature, with constants, or reading one storage as two dtypes, a plan is not traced (its
    op runs it per call instead), and says why."""
    import json

    x, w = hidden(), norm_layer().weight.detach()
    rec, judged = _judged(norm_problem, judge, TRACING.read_text())
    assert "not at the judged signature" in judged.untraceable([x[:, :4].contiguous(), w])
    assert "not at the judged signature" in judged.untraceable([x.transpose(0, 1).contiguous().transpose(0, 1), w])
    assert judged.untraceable([x, 1.0]) == "an input is not a tensor"
    _, const = _judged(norm_problem, judge, SLEEPER_CONST.read_text())
    assert const.untraceable([x, w]) == "its plan carries constants"
    # The kernel's output pointer read as int32: the same bytes, another dtype, which one as_strided cannot give.
    plan = json.loads(rec.plan)
    [launch] = [s for s in plan["steps"] if s["op"] == "launch"]
    launch["args"]["out_ptr"]["t"]["dtype"] = "int32"
    _, retyped = _judged(norm_problem, judge, TRACING.read_text(), json.dumps(plan))
    assert "as float32 and int32" in retyped.untraceable([x, w])
    # The output written through a view whose rows are one row (stride 0): traced, the write would land in a clone
    # with rows of their own.
    launch["args"]["out_ptr"]["t"].update(dtype="float32", stride=[0, 0, 1])
    _, broadcast = _judged(norm_problem, judge, TRACING.read_text(), json.dumps(plan))
    assert broadcast.untraceable([x, w]) == "its plan views a buffer with elements that share memory"


@pytest.mark.gpu
def test_on_a_gpu_a_compiled_graph_traces_the_judged_plan_never_the_forward(tmp_path):
    """The tracing exploit's forward is right on real tensors (the judge's, a custom_op's) and wrong under a
    tracer's. A compiled graph's triton_op traces the kernel's judged plan, not its forward: every call is right,
    and the report says the plan was traced into the graph."""
    from ks_inductor.compiler import backend as B
    from ks_inductor.judge import Judge, JudgeConfig
    from tests.cached_kernels import norm_key

    torch._dynamo.reset()
    B.clear_reports()
    torch.manual_seed(0)
    model, x = _NormThenLinear(64).cuda().eval(), torch.randn(32, 64, device="cuda")
    db = f"sqlite:///{tmp_path / 'k'}.db"
    key, seen = norm_key(model, x, db)
    [problem] = [p for p in seen.problems if p.key == key]
    source = TRACING.read_text()
    with Judge(JudgeConfig(trials=3)) as judge:
        res = judge.evaluate(problem, source)
    assert res.accepted and res.plan, res.feedback_text()
    with KernelStore(db) as store:
        store.upsert_problem(problem)
        store.add_kernel(KernelRecord(problem_key=key, source=source, backend=judge.fingerprint.backend,
                                      fingerprint=B.current_fingerprint().to_json(), status=VERIFIED, timed=True,
                                      trials=res.trials, plan=res.plan))
    B.forget_stores()
    # Served whatever its speed (min_speedup 0): what is tested is what the graph runs.
    compiled = torch.compile(model, backend="kernelsmith", options={
        "kernelsmith.db": db, "kernelsmith.graph_guard": "off", "kernelsmith.min_speedup": 0.0})
    with torch.no_grad():
        want = model(x)
        wrong = sum(not torch.allclose(compiled(x), want, atol=1e-4, rtol=1e-4) for _ in range(12))
    report = B.compile_reports()[-1]
    [region] = [r for r in report.regions if r.key == key]
    torch._dynamo.reset()
    B.forget_stores()
    assert wrong == 0 and region.status == "hit", report.to_json()
    assert region.launch == "traced judged plan" and report.variant == "triton_op", report.to_json()


def test_at_another_signature_a_kernel_is_recorded_once_and_runs_as_a_plan(norm_problem):
    """What serves a kernel at a signature it is proven at (``plan_at``): its launches recorded there once, as the
    judge records them (kernels recorded, not launched: the plan compiles and runs them), then run as a plan, with
    kernels built from the source alone, that declines any other signature."""
    from integrations.checks import PackKernel, plan_at
    from ks_inductor.judge import plan as PL
    from ks_inductor.signature import call_signature

    # (the tracing exploit, which is right on real tensors)
    rec = KernelRecord(problem_key=norm_problem.key, source=TRACING.read_text(), backend="cpu-interpret",
                       fingerprint={})
    kernel = PackKernel(rec, norm_problem, None)
    x, w = torch.randn(3, 5, 64), torch.randn(64)
    runs, why = plan_at(kernel, call_signature([x, w]), torch.device("cpu"))
    assert why == "" and runs is not None and not PL.autotuned(kernel.loaded.module)
    assert runs.kernels is not kernel.loaded.module  # the plan's kernels are a module of their own
    [step] = runs.plan.steps
    assert step["op"] == "launch" and step["grid"] == [15, 1, 1]
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(runs(x, w), want, atol=1e-5, rtol=1e-5)
    assert runs(x[:2], w) is None  # another signature is declined
