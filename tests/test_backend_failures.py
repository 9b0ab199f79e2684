"""Never worse than Inductor: every failure mode gives a warning and a correct model; the backend is found by name
without importing kernelsmith; the on-miss policies; timed kernels slower than Inductor are not used."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn

from kernel_cache.store import KernelStore
from ks_inductor.compiler import backend as B
from ks_inductor.compiler.explain import explain
from tests.cached_kernels import add_kernel, norm_kernel_module, norm_key, recorded_plan, region_inputs

INDUCTOR = {"compile_threads": 1}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Tiny(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w
        return self.lin(h)


@pytest.fixture()
def model():
    torch.manual_seed(0)
    return Tiny().eval(), torch.randn(4, 16)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    B.clear_reports()
    yield
    B.forget_stores()


def _run(model, x, db, **opts):
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR, **opts})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = compiled(x)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    return [w for w in caught if issubclass(w.category, (B.KernelsmithWarning, RuntimeWarning))
            and "kernelsmith" in str(w.message)]


def test_backend_is_found_by_name_without_importing_kernelsmith(tmp_path):
    code = textwrap.dedent("""
        import sys, torch
        assert "kernelsmith" in torch._dynamo.list_backends()
        assert "ks_inductor.compiler.backend" not in sys.modules
        fn = torch._dynamo.lookup_backend("kernelsmith")
        print(fn.__module__, fn.__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ks_inductor.compiler.backend", "kernelsmith_backend"]


def test_corrupt_database_warns_falls_back_and_is_not_modified(tmp_path, model):
    m, x = model
    db = tmp_path / "kernels.db"
    junk = b"this is not an sqlite database\n" * 64
    db.write_bytes(junk)
    caught = _run(m, x, str(db))
    assert any("kernel cache or region analysis unavailable" in str(w.message) for w in caught)
    assert db.read_bytes() == junk
    assert B.compile_reports()[-1].fallback_reason


def test_unreachable_database_warns_and_falls_back(model):
    m, x = model
    caught = _run(m, x, "postgresql://kernelsmith@127.0.0.1:9/kernels")
    assert caught and B.compile_reports()[-1].swapped == 0


def test_a_database_in_a_missing_folder_warns_and_creates_nothing(tmp_path, model):
    m, x = model
    db = tmp_path / "nonexistent" / "dir" / "x.db"
    caught = _run(m, x, str(db))
    assert any(f"the folder {db.parent} does not exist" in str(w.message) and "using Inductor" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert not (tmp_path / "nonexistent").exists()
    assert B.compile_reports()[-1].swapped == 0


def test_a_served_kernels_module_never_runs_in_the_users_process(tmp_path, model):
    """A compiled graph runs a cached kernel's judged plan, whose kernels are built from the Triton kernels of its
    source alone: the rest of the candidate's Python (its module's top level, ``ModelNew``) never runs here, so a
    module that would fail to import, or do anything else at import, serves all the same."""
    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    marker = tmp_path / "imported"
    source = norm_kernel_module() + f"\nopen({str(marker)!r}, 'w').close()\nraise ImportError('no such toolkit')\n"
    add_kernel(db, key, source, plan=recorded_plan(norm_kernel_module(), region_inputs(seen, key)))
    caught = _run(m, x, db)  # the outputs match eager's
    report = B.compile_reports()[-1]
    assert report.swapped == 1 and not caught, (report.to_json(), [str(w.message) for w in caught])
    assert not marker.exists()


def test_a_kernel_whose_kernels_do_not_build_is_not_served(tmp_path, model):
    """A record whose Triton kernels cannot be built here (the plan names a kernel its source lacks) leaves its
    region to Inductor, and says why."""
    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    plan = recorded_plan(norm_kernel_module(), region_inputs(seen, key))
    add_kernel(db, key, norm_kernel_module().replace("_rmsnorm", "_other_norm"), plan=plan)
    _run(m, x, db)
    report = B.compile_reports()[-1]
    (norm,) = [r for r in report.regions if r.kind == "norm"]
    assert report.swapped == 0 and norm.status == B.UNUSABLE and "judged plan cannot run here" in norm.note, norm.note


BROKEN_AT_RUNTIME = norm_kernel_module(fails=True)  # its judged plan's launch raises, as a device fault would


def test_kernel_failing_at_run_time_warns_once_and_uses_the_reference(tmp_path, model):
    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    add_kernel(db, key, BROKEN_AT_RUNTIME, region_inputs(seen, key))
    caught = _run(m, x, db)
    assert B.compile_reports()[-1].swapped == 1
    assert [w for w in caught if "failed at run time" in str(w.message)]
    compiled = torch.compile(m, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plan", ["", "{not a plan", '{"storages": [], "steps": [], "outputs": []}'])
def test_a_kernel_without_a_judged_plan_that_runs_here_is_not_served(tmp_path, model, plan):
    """Only a judged plan runs in a compiled graph: a record with none, or with one that cannot run here, leaves its
    region to Inductor (the forward, which no judge ran as it would run here, never stands in), and says why."""
    m, x = model
    db = str(tmp_path / "k.db")
    key, _ = norm_key(m, x, db)
    # A forward that would turn every output wrong, were it run.
    add_kernel(db, key, norm_kernel_module().replace("return out", "return out * 0 + 1"), plan=plan)
    caught = _run(m, x, db)  # the outputs match eager's
    report = B.compile_reports()[-1]
    (norm,) = [r for r in report.regions if r.kind == "norm"]
    assert report.swapped == 0 and norm.status == B.UNUSABLE, report.to_json()
    assert "judged plan" in norm.note, norm.note
    assert not [w for w in caught if "failed at run time" in str(w.message)]


def test_timed_kernel_slower_than_inductor_is_not_used(tmp_path, model):
    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    add_kernel(db, key, BROKEN_AT_RUNTIME, region_inputs(seen, key), timed=True, speedup_inductor=0.8, median_ms=1.0)
    _run(m, x, db)
    report = B.compile_reports()[-1]
    (norm,) = [r for r in report.regions if r.kind == "norm"]
    assert norm.status == B.SLOWER and report.swapped == 0


def test_unsupported_operation_goes_to_inductor(tmp_path):
    class U(nn.Module):
        def forward(self, x):
            return torch.sort(x, -1).values * 2.0

    x = torch.randn(4, 8)
    result = explain(U(), x, db=str(tmp_path / "k.db"))
    unsupported = [r for r in result.regions if r.status == B.UNSUPPORTED]
    assert [r.ops for r in unsupported] == ["sort"]
    _run(U(), x, str(tmp_path / "k.db"))


def test_record_policy_writes_misses(tmp_path, model):
    m, x = model
    db = str(tmp_path / "k.db")
    _run(m, x, db, **{"kernelsmith.on_miss": "record"})
    store = KernelStore(db)
    try:
        misses = store.misses()
    finally:
        store.close()
    keys = {r.key for r in B.compile_reports()[-1].regions if r.index >= 0}
    assert {m_["key"] for m_ in misses} == keys
    assert all(m_["problem"]["source"] for m_ in misses)


def test_guards_on_dtype_and_layout(tmp_path, model):
    """A kernel serves the dtype and strides it was verified for: other inputs recompile and miss."""
    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    add_kernel(db, key, BROKEN_AT_RUNTIME, region_inputs(seen, key))
    compiled = torch.compile(m, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x)
        assert B.compile_reports()[-1].swapped == 1
        xt = torch.randn(16, 4).t()  # same shape, other strides
        torch.testing.assert_close(compiled(xt), m(xt), rtol=1e-5, atol=1e-5)
        (norm,) = [r for r in B.compile_reports()[-1].regions if r.kind == "norm"]
        assert norm.key != key and norm.status == B.MISS


def test_disabled_backend_is_plain_inductor(tmp_path, model):
    m, x = model
    _run(m, x, str(tmp_path / "k.db"), **{"kernelsmith.enabled": False})
    assert B.compile_reports() == []


def test_options_are_validated_and_environment_is_read(monkeypatch):
    with pytest.raises(ValueError, match="unknown kernelsmith option"):
        B.BackendOptions.resolve({"kernelsmith.nope": 1})
    with pytest.raises(ValueError, match="on_miss"):
        B.BackendOptions.resolve({"kernelsmith.on_miss": "panic"})
    monkeypatch.setenv("KERNELSMITH_ON_MISS", "record")
    monkeypatch.setenv("KERNELSMITH_BUDGET", "7")
    opts, inductor = B.BackendOptions.resolve({"max_autotune": True, "kernelsmith.min_speedup": 1.1})
    assert (opts.on_miss, opts.budget, opts.min_speedup) == ("record", 7, 1.1)
    assert inductor == {"max_autotune": True}


def test_evolve_policy_finds_kernels_during_compile(tmp_path, model):
    m, x = model
    db = str(tmp_path / "k.db")
    _run(m, x, db, **{"kernelsmith.on_miss": "evolve", "kernelsmith.budget": 1,
                      "kernelsmith.judge_backend": "triton-interpret"})
    report = B.compile_reports()[-1]
    evolved = [r for r in report.regions if r.status == B.EVOLVED]
    assert evolved and report.swapped == len(evolved), json.dumps(report.to_json())
    # the next compile is a plain hit
    torch._dynamo.reset()
    _run(m, x, db)
    assert B.compile_reports()[-1].hits == len(evolved)


def test_rewritten_graph_keeps_which_inputs_are_parameters(tmp_path, model, monkeypatch):
    """AOTAutograd reads Dynamo's marks to tell parameters (static addresses) from activations; under CUDA graphs
    an unmarked weight is copied into the graph's buffers on every call. The graph with swaps keeps the marks."""
    from torch._functorch._aot_autograd.frontend_utils import _try_get_metadata_from_dynamo

    m, x = model
    db = str(tmp_path / "k.db")
    key, seen = norm_key(m, x, db)
    add_kernel(db, key, BROKEN_AT_RUNTIME, region_inputs(seen, key))
    seen = []
    real = B.rewrite

    def spy(gm, hits, use_triton_op):
        new_gm, swapped = real(gm, hits, use_triton_op)
        seen.append((gm, new_gm))
        return new_gm, swapped

    monkeypatch.setattr(B, "rewrite", spy)
    _run(m, x, db)
    assert B.compile_reports()[-1].swapped == 1
    (gm, new_gm), = seen

    def static_inputs(mod):
        n = len(mod.graph.find_nodes(op="placeholder"))
        return _try_get_metadata_from_dynamo(mod, {}.keys(), n, [None] * n)[1]

    assert static_inputs(gm), "Dynamo marked no parameter: the test model no longer exercises this"
    assert static_inputs(new_gm) == static_inputs(gm)
