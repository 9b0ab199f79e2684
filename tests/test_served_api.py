"""``ks_inductor.served()``: per region of a compile, whether the cached kernel or Inductor ran it, and why."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def demo(tmp_path, monkeypatch):
    import torch._dynamo

    from ks_inductor.compiler.backend import clear_reports
    from ks_inductor.demo import build_model

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch._dynamo.reset()
    clear_reports()
    yield build_model(), "sqlite:///" + str(tmp_path / "kernels.db")
    torch._dynamo.reset()
    clear_reports()


def _compile(model, inputs, db):
    import torch

    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db})
    with torch.no_grad():
        compiled(*inputs)


def test_an_empty_cache_serves_every_region_from_inductor_and_says_why(demo):
    import ks_inductor

    (model, inputs), db = demo
    _compile(model, inputs, db)
    report = ks_inductor.served()
    regions = [r for r in report.regions if r.index >= 0]
    assert regions and all(r.served == "inductor" for r in regions)
    assert all(r.why == "no verified kernel in the cache for this region's key" for r in regions)
    data = json.loads(json.dumps(report.to_json()))
    assert data["kernels"] == 0 and len(data["regions"]) == len(report.regions)
    text = str(report)
    assert "<rich" not in text and "inductor" in text and "no verified kernel" in text
    # clear=True forgets what was read.
    assert ks_inductor.served(clear=True).regions and not ks_inductor.served().regions


def test_a_warmed_region_is_served_by_its_kernel(demo):
    import ks_inductor
    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import problems_from_model, warm

    (model, inputs), db = demo
    problems = problems_from_model(model, inputs, db=db, judge_backend="triton-interpret")
    store = KernelStore(db)
    warm(problems[:1], store, EvolveConfig(budget=1, backend="triton-interpret"))
    store.close()
    _compile(model, inputs, db)
    report = ks_inductor.served()
    hit = [r for r in report.regions if r.key == problems[0].key]
    assert hit and hit[0].served == "kernel" and hit[0].kernel_id is not None, report.to_json()
    assert hit[0].why.startswith(f"kernel {hit[0].kernel_id} from the cache")
    # a warmed kernel carries the plan it was judged with, and the compiled graph's op runs that
    assert hit[0].why.endswith("running judged plan"), hit[0].why
    assert report.kernels == 1


def test_explain_prints_as_its_table(demo):
    import ks_inductor

    (model, inputs), db = demo
    ex = ks_inductor.explain(model, *inputs, db=db, judge_backend="triton-interpret")
    text = str(ex)
    assert "<rich" not in text and "why" in text and "no verified kernel" in text
    rows = [r for g in ex.to_json()["graphs"] for r in g["regions"]]
    assert rows and all(r["why"] for r in rows)
