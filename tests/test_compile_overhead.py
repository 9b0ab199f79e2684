"""What a compile that hits the kernel cache must not redo: tracing every region to aten again (the analysis is
kept on disk), a graph AOTAutograd's and Inductor's caches refuse (the swapped graph hits them), the graph
guard's second compile and timed runs (its decision is kept in the kernel database), and importing SQLAlchemy
to read the cache. One test runs the second compile in a real new process; the others simulate one by clearing
the in-process memos, so that what is then reused can only have come from disk. Counters, not timings."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from kernel_cache.record import KernelRecord
from kernel_cache.store import KernelStore
from ks_inductor.catalogue.models import NormResidual
from ks_inductor.compiler import backend as B
from ks_inductor.compiler import graph_guard as gg
from ks_inductor.compiler import regions as rg
from ks_inductor.compiler.analysis_memo import ANALYSIS_CACHE_ENV
from tests.cached_kernels import norm_kernel_module, store_region_kernels

INDUCTOR = {"compile_threads": 1}
ROOT = Path(__file__).resolve().parent.parent


def _inputs():
    return torch.randn(8, 32), torch.randn(8, 32)


def _new_process():
    """Forget what this process memoized: compiles after this only reuse what was kept on disk."""
    torch._dynamo.reset()
    rg._NODE_MEMO.clear()
    rg._PROBLEM_MEMO.clear()
    gg._GUARD_MEMO.clear()
    B.forget_stores()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    _new_process()
    B.clear_reports()
    yield
    _new_process()


def _warm(model, inputs, db, source=lambda p: norm_kernel_module(residual=True)):
    """One kernel per region key of ``model`` (NormResidual's one region: the residual add and the norm), stored as
    the interpreter judge would (untimed, with its plan)."""
    problems = store_region_kernels(model, inputs, db, source)
    _new_process()
    return problems


def _compile_and_run(model, inputs, db, **opts):
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR, **opts})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(*inputs)
        want = model(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return B.compile_reports()[-1]


@pytest.fixture()
def warmed(tmp_path):
    torch.manual_seed(0)
    model, inputs = NormResidual(32).eval(), _inputs()
    db = str(tmp_path / "kernels.db")
    _warm(model, inputs, db)
    return model, inputs, db


def _analyze(model, inputs, db, full=False):
    """The backend's analysis of the model's graph, without compiling it: its report, or with ``full`` the graph
    and all that ``analyze`` returns."""
    graphs = []

    def capture(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(*inputs)
    opts, _ = B.BackendOptions.resolve({"kernelsmith.db": db})
    result = B.analyze(graphs[-1], opts, act_on_miss=False)
    return (graphs[-1], result) if full else result[0]


def test_a_new_process_reads_region_keys_from_disk_instead_of_tracing(warmed, tmp_path, monkeypatch):
    model, inputs, db = warmed
    memo_dir = tmp_path / "home" / "analysis"
    for f in memo_dir.glob("*.json"):
        f.unlink()  # what explain kept while warming
    first = _compile_and_run(model, inputs, db)
    assert first.hits >= 1 and first.swapped == first.hits, first.to_json()
    assert first.traced_nodes > 0 and first.traced_regions > 0
    assert list(memo_dir.glob("*.json"))

    _new_process()
    second = _analyze(model, inputs, db)
    assert (second.traced_nodes, second.traced_regions) == (0, 0), second.to_json()
    assert [(r.key, r.status) for r in second.regions] == [(r.key, r.status) for r in first.regions]

    # A damaged memo is recomputed (and rewritten), never trusted.
    for f in memo_dir.glob("*.json"):
        data = json.loads(f.read_text())
        data["problems"] = {k: "garbage" for k in data["problems"]}
        data["nodes"] = {k: [1, 2] for k in data["nodes"]}
        f.write_text(json.dumps(data))
    _new_process()
    third = _analyze(model, inputs, db)
    assert third.traced_nodes > 0 and third.traced_regions > 0
    assert [r.key for r in third.regions] == [r.key for r in first.regions]
    for f in memo_dir.glob("*.json"):
        data = json.loads(f.read_text())
        assert all(isinstance(p, dict) for p in data["problems"].values()), "the damaged entries were not replaced"

    # Turned off, nothing is read.
    monkeypatch.setenv(ANALYSIS_CACHE_ENV, "0")
    _new_process()
    assert _analyze(model, inputs, db).traced_regions > 0


def test_memo_is_only_kept_for_functions_torch_pins():
    """A user function in the graph may mean something else in the next process under the same name."""

    @torch._dynamo.allow_in_graph
    def user_scale(x):
        return x * 3.0

    graphs = []

    def capture(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch.compile(lambda x: user_scale(torch.relu(x)) + 1.0, backend=capture)(torch.randn(4, 8))
    part = rg.partition(graphs[-1])
    assert part.memo is None
    assert not any(r.stable for r in part.regions)
    torch._dynamo.reset()
    torch.compile(lambda x: torch.sigmoid(torch.relu(x)) + 1.0, backend=capture)(torch.randn(4, 8))
    part = rg.partition(graphs[-1])
    assert part.memo is not None and all(r.stable for r in part.regions)


def test_swapped_graph_calls_only_what_aotautograds_cache_accepts(warmed):
    """A call AOTAutograd's cache does not know makes it bypass: every compile of the graph is then traced and
    lowered again (a private helper standing in for ``operator.getitem`` once did that to every region with two
    outputs). The counters of a real second compile are checked in the new-process test below."""
    from torch._functorch._aot_autograd.autograd_cache import check_node_safe

    model, inputs, db = warmed
    gm, (report, hits, _) = _analyze(model, inputs, db, full=True)
    new_gm, swapped = B.rewrite(gm, hits, use_triton_op=False)
    assert swapped == 1, report.to_json()
    kernel_calls = [n for n in new_gm.graph.nodes if n.op == "call_function" and "kernelsmith" in str(n.target)]
    assert [len(n.users) for n in kernel_calls] == [2], "the region no longer has two outputs: the test lost its point"
    for node in new_gm.graph.nodes:
        check_node_safe(node)  # raises BypassAOTAutogradCache for a call the cache refuses


def _quick_compare(monkeypatch):
    """gg.compare with short rounds, counting its calls."""
    calls = []
    real = gg.compare

    def spy(swapped, inductor, inputs, cfg=None, seed=0):
        calls.append(1)
        return real(swapped, inductor, inputs, gg.GuardConfig(rounds=3, round_ms=3.0), seed)

    monkeypatch.setattr(gg, "compare", spy)
    return calls


def _count_compiles(monkeypatch):
    import torch._inductor.compile_fx as cfx

    calls = []
    depth = [0]
    real = cfx.compile_fx

    def spy(gm, *a, **k):  # compile_fx calls itself once it has applied its config patches: count the outer call
        if depth[0] == 0:
            calls.append(gm)
        depth[0] += 1
        try:
            return real(gm, *a, **k)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return calls


def test_a_stored_negative_decision_skips_compiling_the_swaps(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, inputs = NormResidual(dim=64).eval(), (torch.randn(16, 64), torch.randn(16, 64))
    db = str(tmp_path / "kernels.db")
    _warm(model, inputs, db, source=lambda p: norm_kernel_module(repeats=2, residual=True))
    compares = _quick_compare(monkeypatch)
    first = _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    assert not first.guard.kept and first.swapped == 0 and first.guard.measurements == 1, first.to_json()

    # One measurement is not reused: the next process measures again, and the two agree.
    _new_process()
    second = _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    assert len(compares) == 2 and not second.guard.kept and second.guard.measurements == 2

    _new_process()
    compiles = _count_compiles(monkeypatch)
    third = _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    assert len(compares) == 2
    assert third.swapped == 0 and third.guard.to_json() == second.guard.to_json()
    assert [r.status for r in third.regions if r.index >= 0] == [B.SLOWER]
    assert len(compiles) == 1 and compiles[0].graph is not None
    assert not any("kernelsmith" in str(n.target) for n in compiles[0].graph.nodes), "compiled the swaps"


def test_a_stored_decision_that_the_next_process_contradicts_is_measured_again(warmed, monkeypatch):
    """A decision taken once (here a drop, as a host under load could measure it) is not reused: the next process
    measures, and its verdict replaces the stored one, again to be confirmed before it decides alone."""
    model, inputs, db = warmed
    verdicts = [False, True, True]

    def scripted(swapped, inductor, inputs, cfg=None, seed=0):
        kept = verdicts.pop(0)
        return gg.GuardResult(kept=kept, swapped_ms=1.0, inductor_ms=1.5 if kept else 0.5,
                              speedup=1.5 if kept else 0.5, lcb=1.2 if kept else 0.4, note="scripted")

    monkeypatch.setattr(gg, "compare", scripted)
    opts = {"kernelsmith.graph_guard": "on"}
    first = _compile_and_run(model, inputs, db, **opts)
    assert first.swapped == 0 and (first.guard.kept, first.guard.measurements) == (False, 1)
    _new_process()
    second = _compile_and_run(model, inputs, db, **opts)
    assert second.swapped == 1 and (second.guard.kept, second.guard.measurements) == (True, 1)
    _new_process()
    third = _compile_and_run(model, inputs, db, **opts)
    assert third.swapped == 1 and (third.guard.kept, third.guard.measurements) == (True, 2)
    _new_process()
    fourth = _compile_and_run(model, inputs, db, **opts)
    assert not verdicts and fourth.swapped == 1 and fourth.guard.to_json() == third.guard.to_json()


def test_unreadable_decisions_are_measured_again(warmed, monkeypatch):
    import sqlite3

    model, inputs, db = warmed
    compares = _quick_compare(monkeypatch)
    _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    for n, tampered in enumerate(("not json", '{"kept": true, "speedup": 9.0, "measurements": "many"}'), 2):
        c = sqlite3.connect(db)
        c.execute("UPDATE graph_guard_decisions SET result = ?", (tampered,))
        c.commit()
        c.close()
        _new_process()
        report = _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
        assert len(compares) == n and report.guard.speedup not in (None, 9.0) and report.guard.measurements == 1


def test_guard_key_separates_what_the_decision_depends_on(warmed):
    from torch.fx.experimental.proxy_tensor import make_fx

    _, _, db = warmed
    store = KernelStore(db)
    try:
        rec = store.kernels()[0]
    finally:
        store.close()

    def f(x):
        return x + 1

    gm = make_fx(f)(torch.randn(4))
    base = gg.guard_key(gm, [torch.randn(4)], [rec], {}, "fp1", "custom_op")
    assert base == gg.guard_key(gm, [torch.randn(4)], [rec], {}, "fp1", "custom_op")
    other_kernel = KernelRecord(problem_key=rec.problem_key, source=rec.source + "\n# v2\n", backend=rec.backend,
                                fingerprint=rec.fingerprint, id=rec.id)
    for key in (gg.guard_key(gm, [torch.randn(4)], [rec], {}, "fp2", "custom_op"),
                gg.guard_key(gm, [torch.randn(4)], [rec], {}, "fp1", "triton_op"),
                gg.guard_key(gm, [torch.randn(4)], [rec], {"max_autotune": True}, "fp1", "custom_op"),
                gg.guard_key(gm, [torch.randn(8)], [rec], {}, "fp1", "custom_op"),
                gg.guard_key(gm, [torch.randn(4)], [other_kernel], {}, "fp1", "custom_op"),
                gg.guard_key(make_fx(lambda x: x + 2)(torch.randn(4)), [torch.randn(4)], [rec], {}, "fp1",
                             "custom_op")):
        assert key != base
    with torch._inductor.config.patch(max_fusion_size=7):
        assert gg.guard_key(gm, [torch.randn(4)], [rec], {}, "fp1", "custom_op") != base


def test_store_guard_decisions_roundtrip(tmp_path):
    with KernelStore(str(tmp_path / "k.db")) as store:
        assert store.guard_decision("k1") is None  # no table yet: a database from before decisions
        store.put_guard_decision("k1", "fp", {"kept": True, "speedup": 1.2})
        store.put_guard_decision("k1", "fp", {"kept": False, "speedup": 0.9})
        assert store.guard_decision("k1") == {"kept": False, "speedup": 0.9}
        assert store.clear_guard_decisions() == 1
        assert store.guard_decision("k1") is None
        store.put_guard_decision("k2", "fp", {"kept": True})
    from ks_inductor.cli import main

    assert main(["cache", "gc", "--db", str(tmp_path / "k.db"), "--forget-guard", "--json"]) == 0
    with KernelStore(str(tmp_path / "k.db")) as store:
        assert store.guard_decision("k2") is None


# A second process compiling the same model against the same caches. Besides the backend it imports only the
# catalogue's models (torch alone; the tests import SQLAlchemy through KernelStore), so that what the backend itself
# imports shows.
CHILD = r"""
import json, sys, warnings
import torch
import torch._inductor.compile_fx as cfx
from torch._dynamo.utils import counters

outer, depth, real = [], [0], cfx.compile_fx


def spy(gm, *a, **k):
    outer.append(depth[0] == 0)
    depth[0] += 1
    try:
        return real(gm, *a, **k)
    finally:
        depth[0] -= 1


cfx.compile_fx = spy


from ks_inductor.catalogue.models import NormResidual

model, inputs = NormResidual(32).eval(), (torch.randn(8, 32), torch.randn(8, 32))
compiled = torch.compile(model, backend="kernelsmith", options=json.loads(sys.argv[1]))
with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for g, w in zip(compiled(*inputs), model(*inputs)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
from ks_inductor.compiler import backend as B

r = B.compile_reports()[-1]
print("CHILD " + json.dumps({
    "traced": [r.traced_nodes, r.traced_regions], "guard": r.guard.to_json() if r.guard else None,
    "swapped": r.swapped, "compiles": sum(outer), "aot": dict(counters["aot_autograd"]),
    "fx": dict(counters["inductor"]), "sqlalchemy": "sqlalchemy" in sys.modules}))
"""


def test_a_new_process_reuses_the_analysis_the_guard_decision_and_inductors_caches(warmed, monkeypatch):
    model, inputs, db = warmed
    # A decision to keep the swaps, whatever this machine's timings say: the new process must then compile the
    # swapped graph (and only it), so its AOTAutograd cache hit is the swapped graph's.
    # Measured in two processes, so that the decision is confirmed and the child reuses it.
    measured = gg.GuardResult(kept=True, swapped_ms=1.0, inductor_ms=1.5, speedup=1.5, lcb=1.2, note="test")
    monkeypatch.setattr(gg, "compare", lambda *a, **k: measured)
    opts = {"kernelsmith.db": db, "kernelsmith.graph_guard": "on", **INDUCTOR}
    _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    _new_process()
    first = _compile_and_run(model, inputs, db, **{"kernelsmith.graph_guard": "on"})
    assert first.guard.measurements == 2 and first.swapped == 1, first.to_json()
    measured = first.guard
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(opts)], capture_output=True, text=True,
                         timeout=600, cwd=str(ROOT), env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    child = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("CHILD "))[len("CHILD "):])
    assert child["traced"] == [0, 0], child
    assert child["guard"] == measured.to_json() and child["swapped"] == 1, child
    assert child["compiles"] == 1, child
    assert child["aot"].get("autograd_cache_hit") == 1 and not child["aot"].get("autograd_cache_bypass"), child
    assert not child["fx"].get("fxgraph_cache_bypass"), child
    assert child["sqlalchemy"] is False, "a compile that only reads the cache imported SQLAlchemy"


def test_lazy_store_reads_with_the_driver_and_opens_the_full_store_when_needed(tmp_path):
    from kernel_cache.access import open_store
    from kernel_cache.errors import CorruptDatabaseError
    from kernel_cache.urls import parse_url

    fp = B.current_fingerprint()
    url = str(tmp_path / "k.db")
    lazy = open_store(url, lazy=True)  # no file yet: the full store creates it
    assert not lazy.fast
    lazy.close()
    with KernelStore(url) as s:
        rec = KernelRecord(problem_key="p", source="x = 1\n", backend="triton-interpret", fingerprint=fp.to_json(),
                           timed=False)
        kid = s.add_kernel(rec)
    lazy = open_store(f"sqlite:///{url}", lazy=True)
    try:
        assert lazy.fast and lazy.lookup("p", fp).id == kid and lazy.guard_decision("g") is None
        lazy.put_guard_decision("g", fp.id, {"kept": True, "speedup": 1.5})  # a write: the full store
        assert not lazy.fast and lazy.guard_decision("g") == {"kept": True, "speedup": 1.5}
    finally:
        lazy.close()
    with KernelStore(url) as s:  # another writer: the fast reader's memo must not serve the old answer
        lazy = open_store(url, lazy=True)
        try:
            assert lazy.lookup("q", fp) is None
            s.add_kernel(KernelRecord(problem_key="q", source="y = 2\n", backend="triton-interpret",
                                      fingerprint=fp.to_json(), timed=False))
            assert lazy.fast and lazy.lookup("q", fp) is not None
        finally:
            lazy.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite" * 100)
    with pytest.raises(CorruptDatabaseError):
        open_store(str(junk), lazy=True)
    assert parse_url("sqlite://").sqlite_file is None and parse_url("postgresql://h/db").sqlite_file is None
    assert parse_url("sqlite:////a/b.db").sqlite_file == Path("/a/b.db")
