"""`kernelsmith warm` and `kernelsmith explain` end to end on CPU: recorded misses → warm → hits; resumable;
a KernelBench folder; a transformers config (when transformers is installed); clear errors for bad input."""

import json
import textwrap

import pytest
import torch

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.models import NORM_FACTORY
from ks_inductor.cli import main
from ks_inductor.compiler import backend as B

REGION_PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


    def get_inputs():
        return [torch.randn(4, 64), torch.randn(64)]


    def get_init_inputs():
        return []
""")

CLI = ["--budget", "1", "--backend", "triton-interpret"]


def _json_of(capsys):
    """The command's JSON: the whole of stdout, which holds nothing else (progress goes to stderr)."""
    return json.loads(capsys.readouterr().out)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    B.forget_stores()


def test_misses_warm_then_hit_and_resume(tmp_path, capsys):
    (tmp_path / "factory.py").write_text(NORM_FACTORY)
    spec = f"{tmp_path / 'factory.py'}:make"
    db = str(tmp_path / "k.db")
    KernelStore(db).close()  # explain reads a cache: the one --db names must be there

    assert main(["explain", spec, "--db", db, "--json"]) == 0
    explained = _json_of(capsys)
    assert explained["hits"] == 0 and explained["misses"] == 1

    # a compile with the record policy leaves a miss row...
    import importlib.util

    mspec = importlib.util.spec_from_file_location("ks_test_factory", tmp_path / "factory.py")
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    model, (x,) = mod.make()
    compiled = torch.compile(model, backend="kernelsmith",
                             options={"kernelsmith.db": db, "kernelsmith.on_miss": "record", "compile_threads": 1})
    with torch.no_grad():
        compiled(x)
    store = KernelStore(db)
    assert len(store.misses()) == 1
    store.close()

    # ...which warm --from-misses turns into a verified kernel (and clears)
    assert main(["warm", "--from-misses", "--db", db, "--json", *CLI]) == 0
    summary = _json_of(capsys)
    assert [i["status"] for i in summary["items"]] == ["found"]
    store = KernelStore(db)
    assert store.misses() == []
    store.close()

    # warming the model itself now judges nothing (resumable)
    assert main(["warm", spec, "--db", db, "--json", *CLI]) == 0
    again = _json_of(capsys)
    assert [(i["status"], i["judged"]) for i in again["items"]] == [("skipped", 0)]

    assert main(["explain", spec, "--db", db]) == 0
    text = capsys.readouterr().out
    assert "hit" in text and "1 hits, 0 misses" in text


def test_a_cached_kernel_without_a_judged_plan_is_searched_again(tmp_path, capsys):
    """A kernel stored without its judged plan serves nothing (explain says why), so warm searches its key again
    rather than skipping it, and the region is then a hit."""
    from kernel_cache.testing import make_record

    (tmp_path / "factory.py").write_text(NORM_FACTORY)
    spec = f"{tmp_path / 'factory.py'}:make"
    db = str(tmp_path / "k.db")
    KernelStore(db).close()
    assert main(["explain", spec, "--db", db, "--json"]) == 0
    [problem_key] = [r["key"] for g in _json_of(capsys)["graphs"] for r in g["regions"] if r["key"]]
    with KernelStore(db) as store:
        store.add_kernel(make_record(problem_key, "planless", B.current_fingerprint(None), timed=False,
                                     median_ms=None, speedup_lcb=None, plan=""))
    B.forget_stores()
    assert main(["explain", spec, "--db", db, "--json"]) == 0
    [region] = [r for g in _json_of(capsys)["graphs"] for r in g["regions"] if r["key"]]
    assert region["status"] == B.UNUSABLE and "no judged plan" in region["note"], region

    assert main(["warm", spec, "--db", db, "--json", *CLI]) == 0
    assert [i["status"] for i in _json_of(capsys)["items"]] == ["found"]
    B.forget_stores()
    assert main(["explain", spec, "--db", db, "--json"]) == 0
    assert _json_of(capsys)["hits"] == 1


def test_warm_kernelbench_folder(tmp_path, capsys):
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "rmsnorm_region.py").write_text(REGION_PROBLEM)
    db = str(tmp_path / "k.db")
    assert main(["warm", str(folder), "--db", db, "--json", *CLI]) == 0
    summary = _json_of(capsys)
    assert [i["status"] for i in summary["items"]] == ["found"]
    assert summary["items"][0]["origin"] == "kernelbench"


def test_bad_inputs_are_usage_errors(tmp_path, capsys):
    db = str(tmp_path / "k.db")
    assert main(["warm", "no_such_module_xyz:make", "--db", db, *CLI]) == 2
    assert "importing no_such_module_xyz failed" in capsys.readouterr().err
    assert main(["warm", "--db", db, *CLI]) == 2
    assert main(["explain", str(tmp_path / "missing.py") + ":make", "--db", db]) == 2


def test_warm_from_transformers_config(tmp_path, capsys):
    pytest.importorskip("transformers")
    db = str(tmp_path / "k.db")
    KernelStore(db).close()
    args = ["explain", "--hf-config", "llama", "--db", db, "--json", "--seq", "8",
            "--hf-set", "hidden_size=32", "--hf-set", "intermediate_size=64", "--hf-set", "num_hidden_layers=1",
            "--hf-set", "num_attention_heads=4", "--hf-set", "num_key_value_heads=2", "--hf-set", "vocab_size=128"]
    assert main(args) == 0
    explained = _json_of(capsys)
    kinds = {r["kind"] for g in explained["graphs"] for r in g["regions"]}
    assert {"norm", "matmul"} <= kinds


def test_hf_dtype_names():
    import torch

    from ks_inductor.warm.sources import WarmError, _torch_dtype

    assert _torch_dtype("bf16") is _torch_dtype("bfloat16") is _torch_dtype("torch.bfloat16") is torch.bfloat16
    assert _torch_dtype("fp16") is torch.float16 and _torch_dtype("fp32") is torch.float32
    with pytest.raises(WarmError, match="unknown dtype"):
        _torch_dtype("bf17")
    with pytest.raises(WarmError, match="unknown dtype"):
        _torch_dtype("nn")  # torch.nn exists but is no dtype


def test_warm_opens_its_database_once(tmp_path, capsys):
    """A model's warm traces the regions, looks them up, searches and stores through one store: one SQLAlchemy
    engine (one connection pool) for the one database, and no second store beside it."""
    from sqlalchemy import Engine, event

    (tmp_path / "factory.py").write_text(NORM_FACTORY)
    db = str(tmp_path / "k.db")
    pools: set[int] = set()

    def connected(conn):
        pools.add(id(conn.engine.pool))

    event.listen(Engine, "engine_connect", connected)
    try:
        assert main(["warm", f"{tmp_path / 'factory.py'}:make", "--db", db, "--json", *CLI]) == 0
    finally:
        event.remove(Engine, "engine_connect", connected)
    assert [i["status"] for i in _json_of(capsys)["items"]] == ["found"]
    assert len(pools) == 1
    assert B._STORES == {}, "warm opened the database a second time, through the backend's shared store"
