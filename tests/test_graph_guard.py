"""The graph-level never-slower rule: a graph whose swaps make it slower than Inductor alone goes to Inductor."""

import warnings

import pytest
import torch
import torch.nn as nn

from ks_inductor.compiler import backend as B
from ks_inductor.compiler import graph_guard as gg
from tests.cached_kernels import add_kernel, norm_kernel_module, norm_key, region_inputs

INDUCTOR = {"compile_threads": 1}


class Norm(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w


# Correct, and slow on purpose: the norm computed over and over, in the interpreter (a launch there costs
# milliseconds, Inductor's C++ norm microseconds).
SLOW_NORM = norm_kernel_module(repeats=2)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    B.clear_reports()
    gg._GUARD_MEMO.clear()
    yield
    B.forget_stores()


def _store_slow_kernel(db, model, *inputs, source=SLOW_NORM):
    key, seen = norm_key(model, inputs, db)
    add_kernel(db, key, source, region_inputs(seen, key))


def _compile_and_run(model, x, db, **opts):
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR, **opts})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(x)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    return B.compile_reports()[-1]


def test_guard_drops_swaps_that_make_the_graph_slower(tmp_path):
    torch.manual_seed(0)
    m, x = Norm().eval(), torch.randn(16, 64)
    db = str(tmp_path / "k.db")
    _store_slow_kernel(db, m, x)
    report = _compile_and_run(m, x, db, **{"kernelsmith.graph_guard": "on"})
    g = report.guard
    assert g is not None and not g.kept, report.to_json()
    assert g.swapped_ms > g.inductor_ms and g.lcb < 1.0
    assert report.swapped == 0 and "graph guard" in report.fallback_reason
    (norm,) = [r for r in report.regions if r.kind == "norm"]
    assert norm.status == B.SLOWER
    # Without the guard the same kernel is swapped in: the guard is what removed it.
    torch._dynamo.reset()
    report = _compile_and_run(m, x, db, **{"kernelsmith.graph_guard": "off"})
    assert report.swapped == 1 and report.guard is None


class NormThenProject(Norm):
    def __init__(self, dim=64):
        super().__init__(dim)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.proj(super().forward(x))


def test_guard_tries_the_kernels_without_eager_regions_after_every_swap_lost(tmp_path):
    """A graph with a kernel (the slow norm) and an eager region (the projection, whose stored room says eager beats
    Inductor): with both swapped the graph loses to Inductor alone, so the kernel is tried without the eager
    region, loses too, and Inductor compiles the graph. Two verdicts, and each region says why it is not served."""
    from kernel_cache.store import KernelStore
    from ks_inductor.judge.room import Room

    torch.manual_seed(0)
    m, x = NormThenProject().eval(), torch.randn(16, 64)
    db = str(tmp_path / "k.db")
    key, result = norm_key(m, x, db)
    (mm,) = [r for r in result.regions if r.kind == "matmul"]
    add_kernel(db, key, SLOW_NORM, region_inputs(result, key))
    store = KernelStore(db)
    store.put_room(mm.key, B.current_fingerprint().id,
                   Room(mm.key, floor_ms=0.01, bound="memory", bandwidth=1e10, eager_ms=1.0, inductor_ms=1.5).to_json())
    store.close()
    report = _compile_and_run(m, x, db, **{"kernelsmith.graph_guard": "on"})
    (first,) = report.guard_tries
    assert not first.kept and report.guard is not None and not report.guard.kept, report.to_json()
    assert report.swapped == 0 and "graph guard" in report.fallback_reason
    by_kind = {r.kind: r for r in report.regions if r.index >= 0}
    assert by_kind["norm"].status == B.SLOWER and by_kind["matmul"].status == B.SLOWER
    assert "tried without them" in by_kind["matmul"].note
    assert len(report.to_json()["guard_tries"]) == 1


def test_guard_runs_by_default_only_for_timed_kernels(tmp_path):
    torch.manual_seed(0)
    m, x = Norm().eval(), torch.randn(16, 64)
    db = str(tmp_path / "k.db")
    _store_slow_kernel(db, m, x)
    report = _compile_and_run(m, x, db)
    assert report.guard is None and report.swapped == 1


def test_guard_does_not_run_a_graph_that_mutates_its_inputs(tmp_path):
    class Mutating(Norm):
        def forward(self, x, acc):
            acc.add_(1.0)
            return super().forward(x) + acc

    torch.manual_seed(0)
    m, x, acc = Mutating().eval(), torch.randn(16, 64), torch.zeros(64)
    db = str(tmp_path / "k.db")
    _store_slow_kernel(db, m, x, acc.clone(), source=norm_kernel_module(repeats=2, plus=True))  # norm(x) * w + acc
    compiled = torch.compile(m, backend="kernelsmith",
                             options={"kernelsmith.db": db, "kernelsmith.graph_guard": "on", **INDUCTOR})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(x, acc)
    # One call, one increment: the guard did not run the graph behind the caller's back.
    assert torch.equal(acc, torch.ones(64))
    torch.testing.assert_close(got, m.__class__.__mro__[1].forward(m, x) + 1.0, rtol=1e-5, atol=1e-5)
    report = B.compile_reports()[-1]
    assert report.swapped == 1 and report.guard is not None and report.guard.kept
    assert "mutates" in report.guard.note


def test_mutation_detection():
    import operator

    def f(x, y):
        y.mul_(2)
        return x * 2

    def g(x):
        return torch.relu(x) + 1

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(operator.setitem, (x, 0, 1.0))
    graph.output(x)
    assert gg.mutation_in(torch.fx.GraphModule(torch.nn.Module(), graph)) is not None
    assert gg.mutation_in(torch.fx.symbolic_trace(f)) is not None
    assert gg.mutation_in(torch.fx.symbolic_trace(g)) is None


def test_compare_prefers_the_faster_and_rejects_a_faulting_graph():
    a = torch.randn(96, 96)

    def fast(x):
        return x + 1

    def slow(x):
        for _ in range(40):
            x = x @ a
        return x

    cfg = gg.GuardConfig(rounds=5, round_ms=8.0)
    assert gg.compare(fast, slow, [a], cfg).kept
    r = gg.compare(slow, fast, [a], cfg)
    assert not r.kept and r.speedup < 1.0

    def broken(x):
        raise RuntimeError("illegal memory access")

    r = gg.compare(broken, fast, [a], cfg)
    assert not r.kept and "illegal memory access" in r.note


def test_guard_restores_the_rng_state():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    gg.compare(lambda x: torch.rand(4), lambda x: torch.rand(4), [torch.zeros(1)], gg.GuardConfig(rounds=2))
    assert torch.equal(torch.get_rng_state(), before)
