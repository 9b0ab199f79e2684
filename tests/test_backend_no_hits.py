"""Never slower than Inductor where nothing is served: with an empty cache, or where the graph guard finds the
swaps slower, ``backend="kernelsmith"`` returns Inductor's own compile. The same generated code as
``backend="inductor"`` for a transformers model nobody tuned kernels for (Qwen2, built from a config), the same
config handed to Inductor, the graph, its inputs, Dynamo's shape environment and the random streams left as
Dynamo made them, and no kernelsmith code run per call. The GPU benchmark that times it is
benchmarks/gpu/inductor_floor.py."""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ks_inductor.catalogue.models import NormResidual
from ks_inductor.compiler import backend as B
from ks_inductor.compiler import graph_guard as gg
from ks_inductor.compiler import regions as rg
from tests.cached_kernels import norm_kernel_module, store_region_kernels

INDUCTOR = {"compile_threads": 1}
ROOT = Path(__file__).resolve().parent.parent
KERNELSMITH_FILES = (str(ROOT / "ks_inductor"), str(ROOT / "kernel_cache"))


def qwen2():
    """A one-layer Qwen2 at toy sizes, random weights: grouped-query attention with biased q/k/v projections,
    RoPE, RMSNorm and a SiLU-gated MLP, none of which a cache here was warmed for."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).eval()


def _ids(batch=2, seq=8):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(1))


def _code(codes):
    """Inductor's generated modules, without the one line that numbers the compiles of this process."""
    return [re.sub(r"^# AOT ID: .*$", "# AOT ID", c, flags=re.M) for c in codes]


def _outer_compiles(monkeypatch):
    """(graph, returned) of each outer ``compile_fx`` call (it calls itself once its config patches are applied)."""
    import torch._inductor.compile_fx as cfx

    calls, depth, real = [], [0], cfx.compile_fx

    def spy(gm, *a, **k):
        depth[0] += 1
        try:
            out = real(gm, *a, **k)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            calls.append((gm, out))
        return out

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return calls


def _recording(backend, into):
    def record(gm, example_inputs, **kwargs):
        out = backend(gm, example_inputs, **kwargs)
        into.append((gm, out))
        return out

    return record


@pytest.fixture(scope="module")
def empty_cache_compiles(tmp_path_factory):
    """The model compiled by Inductor, then by kernelsmith against an empty cache, each a full compile (no FX or
    AOTAutograd cache between them): generated code, outputs, what the backend returned and what Inductor's
    ``compile_fx`` made, and the compiled models."""
    from torch._inductor.utils import run_and_get_code

    mp = pytest.MonkeyPatch()
    try:
        model, ids = qwen2(), _ids()
        db = str(tmp_path_factory.mktemp("empty") / "kernels.db")
        runs = {}
        for name in ("inductor", "kernelsmith"):
            torch._dynamo.reset()
            B.clear_reports()
            returned, compiles = [], _outer_compiles(mp)
            if name == "inductor":
                compiled = torch.compile(model, backend="inductor", options=dict(INDUCTOR))
            else:
                compiled = torch.compile(model, backend=_recording(B.kernelsmith_backend, returned),
                                         options={"kernelsmith.db": db, **INDUCTOR})
            with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False), \
                    torch._functorch.config.patch(enable_autograd_cache=False):
                out, codes = run_and_get_code(lambda c=compiled: c(ids, use_cache=False).logits)
            runs[name] = {"out": out, "codes": _code(codes), "returned": returned, "compiles": list(compiles),
                          "compiled": compiled, "reports": B.compile_reports()}
            mp.undo()
        yield model, ids, runs
    finally:
        mp.undo()
        torch._dynamo.reset()
        B.forget_stores()


def test_empty_cache_generates_inductors_code(empty_cache_compiles):
    _, _, runs = empty_cache_compiles
    ind, ks = runs["inductor"], runs["kernelsmith"]
    (report,) = ks["reports"]
    regions = [r for r in report.regions if r.index >= 0]
    # The analysis ran over the whole layer and found nothing to serve: what follows is about that path.
    assert len(regions) >= 8 and {"norm", "matmul", "attention"} <= {r.kind for r in regions}, report.to_json()
    assert report.swapped == 0 and not any(r.status in B.SERVED for r in regions)
    assert ind["codes"] and ks["codes"] == ind["codes"]
    assert torch.equal(ks["out"], ind["out"])


def test_empty_cache_returns_inductors_callable_as_it_is(empty_cache_compiles):
    _, _, runs = empty_cache_compiles
    ks = runs["kernelsmith"]
    (compiled_gm, compiled), = ks["compiles"]
    (dynamo_gm, returned), = ks["returned"]
    assert compiled_gm is dynamo_gm, "Inductor compiled another graph than the one Dynamo made"
    assert returned is compiled, "the backend put something around Inductor's compiled graph"
    assert type(returned) is type(runs["inductor"]["compiles"][0][1])


def test_a_call_runs_no_kernelsmith_code(empty_cache_compiles):
    model, ids, runs = empty_cache_compiles
    compiled = runs["kernelsmith"]["compiled"]
    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(KERNELSMITH_FILES):
            called.add(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    with torch.no_grad():
        compiled(ids, use_cache=False)  # whatever a first call does once is not what each call costs
        sys.setprofile(profile)
        try:
            for _ in range(3):
                compiled(ids, use_cache=False)
        finally:
            sys.setprofile(None)
    assert not called, sorted(called)


# A fresh process: nothing of kernelsmith imported before the first snapshot, so whatever its import or its
# analysis changed in Inductor's, AOTAutograd's or Dynamo's config, or in torch's numerics, shows. compile_fx is
# replaced by a spy that records what it is asked and compiles nothing.
CONFIG_CHILD = r"""
import json, sys, tempfile
import torch
import torch._inductor.compile_fx as cfx


def state():
    return {"inductor": repr(sorted(torch._inductor.config.get_config_copy().items())),
            "functorch": repr(sorted(torch._functorch.config.get_config_copy().items())),
            "dynamo": repr(sorted(torch._dynamo.config.get_config_copy().items())),
            "numerics": [torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
                         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                         torch.backends.cudnn.benchmark, torch.get_num_threads(), str(torch.get_default_dtype())],
            "rng": torch.random.get_rng_state().tolist()}


asked = []


def spy(gm, example_inputs, **kwargs):
    asked.append({"code": gm.code, "kwargs": repr(sorted(kwargs.items())), "state": state()})
    return gm.forward


cfx.compile_fx = spy
x = torch.linspace(-1, 1, 32).reshape(4, 8)
before = state()
mode, options = json.loads(sys.argv[1])
db = tempfile.mkdtemp() + "/kernels.db"
fn = lambda x: torch.softmax(torch.relu(x) * 2.0, -1) + 1.0
torch.compile(fn, backend="inductor", mode=mode, options=options)(x)
torch._dynamo.reset()
ks_options = {**(options or {}), "kernelsmith.db": db, **({"kernelsmith.mode": mode} if mode else {})}
torch.compile(fn, backend="kernelsmith", options=ks_options)(x)
from ks_inductor.compiler import backend as B

after = state()
print("CHILD " + json.dumps({"asked": asked, "before": before, "after": after,
                             "regions": len(B.compile_reports()[-1].regions)}))
"""


@pytest.mark.parametrize("mode,options", [
    (None, None),
    ("max-autotune-no-cudagraphs", None),
    ("reduce-overhead", None),
    # Inductor reads "-" in an option's name as "_": the backend must hand Inductor the same patches
    (None, {"max-autotune": True, "epilogue_fusion": False, "compile_threads": 1}),
])
def test_empty_cache_hands_inductor_its_own_config(mode, options, tmp_path):
    out = subprocess.run([sys.executable, "-c", CONFIG_CHILD, json.dumps([mode, options])], capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path),
                         env={**os.environ, "PYTHONPATH": str(ROOT), "KERNELSMITH_ON_MISS": "fallback"})
    assert out.returncode == 0, out.stderr[-3000:]
    child = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("CHILD "))[len("CHILD "):])
    assert child["regions"] >= 1  # the analysis ran
    inductor, kernelsmith = child["asked"]
    assert kernelsmith["code"] == inductor["code"]
    assert kernelsmith["kwargs"] == inductor["kwargs"]
    for key in child["before"]:
        assert kernelsmith["state"][key] == inductor["state"][key] == child["before"][key], key
        assert child["after"][key] == child["before"][key], key


def _snapshot(gm, example_inputs):
    """Everything of Dynamo's graph and inputs that Inductor reads, by value and by identity."""
    from torch._guards import detect_fake_mode

    nodes = [(n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs), getattr(n, "_dynamo_source", None),
              sorted((k, id(v), repr(v)) for k, v in n.meta.items())) for n in gm.graph.nodes]
    shape_env = getattr(detect_fake_mode(example_inputs), "shape_env", None)
    return {
        "code": gm.code, "nodes": nodes, "attrs": sorted(gm.__dict__),
        "meta": sorted((k, id(v)) for k, v in gm.meta.items()),
        "tensors": [(k, id(t), t._version) for k, t in (*gm.named_parameters(), *gm.named_buffers())],
        "inputs": [(id(x), repr(x), getattr(x, "_version", None)) for x in example_inputs],
        "guards": [str(g.expr) for g in shape_env.guards] if shape_env is not None else None,
        "replacements": {str(k): str(v) for k, v in shape_env.replacements.items()} if shape_env else None,
        "rng": torch.random.get_rng_state(),
    }


@pytest.mark.parametrize("dynamic", [False, True])
def test_analysis_leaves_what_dynamo_made_as_it_was(dynamic, tmp_path, monkeypatch):
    """The analysis traces every node and region to aten (fake tensors, make_fx), looks them up and records the
    misses: Dynamo's graph, its node metadata, the example inputs, the shape guards and the random stream are
    what they were before it."""
    # Nothing memoized, in this process or on disk: every node and region is traced.
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(rg, "_NODE_MEMO", {})
    monkeypatch.setattr(rg, "_PROBLEM_MEMO", {})
    opts, _ = B.BackendOptions.resolve({"kernelsmith.db": str(tmp_path / "kernels.db"),
                                        "kernelsmith.on_miss": "record"})
    seen = []

    def backend(gm, example_inputs, **_):
        before = _snapshot(gm, example_inputs)
        report, hits, _ = B.analyze(gm, opts)
        after = _snapshot(gm, example_inputs)
        seen.append((len(report.regions), report.traced_regions))
        for key in before:
            if key == "rng":
                assert torch.equal(after[key], before[key]), "the analysis moved the random stream"
            else:
                assert after[key] == before[key], key
        assert not hits
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(qwen2(), backend=backend, dynamic=dynamic)(_ids(), use_cache=False)
    assert seen and max(n for n, _ in seen) >= 8 and all(traced for _, traced in seen), seen


# ------------------------------------------------------------------------------------------ warmed, swaps slower

def _warm(model, inputs, db):
    """One kernel per region of ``model`` (NormResidual's one region), correct, with its plan."""
    store_region_kernels(model, inputs, db, lambda p: norm_kernel_module(residual=True))
    B.forget_stores()


@pytest.fixture()
def slower(tmp_path, monkeypatch):
    """A cache with a kernel for each region of NormResidual, and a graph guard that always finds the graph with
    the swaps slower than Inductor alone."""
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    model, inputs = NormResidual(32).eval(), (torch.randn(8, 32), torch.randn(8, 32))
    db = str(tmp_path / "kernels.db")
    _warm(model, inputs, db)
    verdicts = []

    def slower_graph(swapped, inductor, inputs, cfg=None, seed=0):
        verdicts.append(inductor)
        return gg.GuardResult(kept=False, swapped_ms=2.0, inductor_ms=1.0, speedup=0.5, lcb=0.4, note="scripted")

    monkeypatch.setattr(gg, "compare", slower_graph)
    torch._dynamo.reset()
    gg._GUARD_MEMO.clear()
    B.clear_reports()
    yield model, inputs, db, verdicts
    torch._dynamo.reset()
    gg._GUARD_MEMO.clear()
    B.forget_stores()


def _kernelsmith(model, db, returned, mode=None, **kw):
    options = {"kernelsmith.db": db, "kernelsmith.graph_guard": "on", **INDUCTOR}
    if mode:
        options["kernelsmith.mode"] = mode
    return torch.compile(model, backend=_recording(B.kernelsmith_backend, returned), options=options, **kw)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_swaps_the_guard_finds_slower_leave_inductors_own_graph(slower, monkeypatch, mode):
    """What is served is Inductor's compile of Dynamo's graph, compiled once. Without CUDA graphs it is the very
    callable the guard timed; with them (which must not record inside the backend) the guard timed a compile of a
    copy of the graph without them, and Dynamo's graph was left for the one served."""
    from torch._inductor.utils import run_and_get_code

    model, inputs, db, verdicts = slower
    compiles, returned = _outer_compiles(monkeypatch), []
    compiled = _kernelsmith(model, db, returned, mode)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ks_codes = run_and_get_code(lambda: compiled(*inputs))
    report = B.compile_reports()[-1]
    # the region's kernel was found and swapped in, and the guard dropped it
    assert [r.status for r in report.regions if r.index >= 0] == [B.SLOWER], report.to_json()
    assert report.swapped == 0 and not report.guard.kept
    (dynamo_gm, served), = returned
    assert [out for gm, out in compiles if gm is dynamo_gm] == [served], \
        "Inductor's own graph was compiled more than once, or is not what is served"
    assert not any("kernelsmith" in str(n.target) for n in dynamo_gm.graph.nodes)
    (timed,) = verdicts
    if mode is None:
        assert timed is served, "what was timed as Inductor alone is not what is served"
    else:
        (timed_gm,) = [gm for gm, out in compiles if out is timed]
        assert timed is not served and timed_gm is not dynamo_gm and timed_gm.code == dynamo_gm.code

    torch._dynamo.reset()
    inductor = torch.compile(model, backend="inductor", **({"mode": mode} if mode else {"options": INDUCTOR}))
    with torch.no_grad():
        _, ind_codes = run_and_get_code(lambda: inductor(*inputs))
    (ind_code,) = _code(ind_codes)
    assert ind_code in _code(ks_codes)


def test_a_known_verdict_against_the_swaps_specialises_no_size(slower):
    """With dynamic sizes, a stored verdict against the swaps gives Inductor's own dynamic graph: no size is
    guarded for kernels that are not served, so another batch runs the same graph without a recompile."""
    model, inputs, db, verdicts = slower
    returned = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _kernelsmith(model, db, returned, dynamic=True)(*inputs)  # measures: the verdict is kept in this process
        assert len(verdicts) == 1
        torch._dynamo.reset()
        returned.clear()
        compiled = _kernelsmith(model, db, returned, dynamic=True)
        compiled(*inputs)
        report = B.compile_reports()[-1]
        assert [r.status for r in report.regions if r.index >= 0] == [B.SLOWER], report.to_json()
        assert report.swapped == 0 and report.guard.note == "scripted"
        assert any(r.symbolic for r in report.regions if r.index >= 0), "the graph lost its dynamic sizes"
        assert len(verdicts) == 1, "the known verdict was measured again"
        other = (torch.randn(5, 32), torch.randn(5, 32))
        got = compiled(*other)
    assert len(returned) == 1, "a batch of another size recompiled: a size was specialised for unserved kernels"
    for g, w in zip(got, model(*other)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)

