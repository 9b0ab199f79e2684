"""Serving a pack in LMDeploy's own layer classes (``lmdeploy.pytorch.nn.RMSNorm``, ``SiluAndMul``) through the
wrapped ``build_op``, under the Triton interpreter.

LMDeploy picks no backend for a CPU device, so the layers here are built by its default backend (its plain-torch
implementations, the "stack's own path" on this machine); on a GPU the same wrapper sits on ``CudaOpsBackend``.
``make test`` installs LMDeploy's wheel without its dependencies, plus the packages its layer modules import
(docs/serving.md); where it is not importable these tests skip, and under ``CI=true`` they fail."""

from __future__ import annotations

import logging
import zipfile

import pytest
import torch

from integrations import guard as G
from integrations import lmdeploy as L
from tests.stacks import layer_pack, require_stack

HIDDEN, INTER, TOKENS, EPS = 64, 96, 12, 1e-6


@pytest.fixture(scope="module", autouse=True)
def _lmdeploy():
    require_stack("lmdeploy.pytorch.nn.norm", "make test installs lmdeploy (docs/serving.md)")


@pytest.fixture(autouse=True)
def _cpu_backend(monkeypatch):
    import lmdeploy.pytorch.backends.selector as selector
    from lmdeploy.pytorch.backends.default.op_backend import DefaultOpsBackend

    monkeypatch.setattr(selector, "_get_backend", lambda: DefaultOpsBackend)
    for k in G.SERVING_ENV:
        monkeypatch.delenv(k, raising=False)
    yield
    L.uninstall()


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """The pack a Llama-style deployment on LMDeploy needs at {TOKENS} tokens a forward, built by the command line."""
    return layer_pack(tmp_path_factory.mktemp("lmdeploy"), "lmdeploy", HIDDEN, INTER, EPS, TOKENS, "float32", lead=(1,),
                      weight_before_residual=True)


def layers():
    from lmdeploy.pytorch.nn.activation import SiluAndMul
    from lmdeploy.pytorch.nn.norm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(HIDDEN, EPS, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
    return norm, SiluAndMul(inplace=False)


def inputs(tokens=TOKENS, dtype=torch.float32):
    g = torch.Generator().manual_seed(tokens)
    return (torch.randn(1, tokens, HIDDEN, generator=g).to(dtype), torch.randn(1, tokens, 2 * INTER, generator=g).to(dtype))


def test_layers_serve_the_pack_and_match_lmdeploy(pack):
    own_norm, own_act = layers()
    st = L.install(pack)
    assert st.refused == "" and any(w.endswith("DefaultOpsBackend") for w in st.wrapped)
    norm, act = layers()
    assert getattr(norm.impl, "kernelsmith", False) and getattr(act.impl, "kernelsmith", False)
    x, h = inputs()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_norm(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(act(h), own_act(h), atol=1e-5, rtol=1e-5)
        # the fused residual form: the norm and the new residual
        r = torch.randn_like(x)
        out, res = norm(x, r)
        want, want_res = own_norm(x, r)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res, want_res)
        # another token count, another dtype: LMDeploy's own implementation
        x5, h5 = inputs(5)
        torch.testing.assert_close(norm(x5), own_norm(x5))
        torch.testing.assert_close(norm(x5, x5.clone())[1], own_norm(x5, x5.clone())[1])
        torch.testing.assert_close(act(h5), own_act(h5))
        torch.testing.assert_close(act(h.double()), own_act(h.double()))
    assert st.stats()["hits"] == {"add_rmsnorm": 1, "rmsnorm": 1, "silu_and_mul": 1}
    assert st.stats()["fallbacks"] == {"add_rmsnorm": {"shape": 1}, "rmsnorm": {"shape": 1},
                                       "silu_and_mul": {"dtype": 1, "shape": 1}}

    L.uninstall()
    norm, act = layers()
    assert not getattr(norm.impl, "kernelsmith", False) and not getattr(act.impl, "kernelsmith", False)


def test_tampered_pack_is_refused(pack, tmp_path, caplog):
    bad = tmp_path / "bad.kspack"
    with zipfile.ZipFile(pack) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename == "kernels/00000.py":
                body = body[:-2] + bytes([body[-2] ^ 1]) + body[-1:]
            zout.writestr(info, body)
    with caplog.at_level(logging.INFO, logger="kernelsmith.integrations"):
        st = L.install(bad)
    assert st.guard is None and st.wrapped == [] and st.refused.startswith("pack refused")
    lines = [r for r in caplog.records if r.name == "kernelsmith.integrations"]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    norm, act = layers()
    assert not getattr(norm.impl, "kernelsmith", False)
    x, _ = inputs()
    assert norm(x).shape == x.shape


def test_unknown_version_and_kill_switch(pack, monkeypatch):
    import lmdeploy.version

    known = lmdeploy.version.__version__
    monkeypatch.setattr(lmdeploy.version, "__version__", "0.99.0")
    st = L.install(pack)
    assert st.wrapped == [] and "0.99.0" in st.refused
    monkeypatch.setattr(lmdeploy.version, "__version__", known)

    monkeypatch.setenv(G.ENV_DISABLE, "1")
    assert L.install(pack).refused == "KERNELSMITH_DISABLE=1"
    monkeypatch.delenv(G.ENV_DISABLE)
    monkeypatch.setenv(G.ENV_PACK, str(pack))
    assert L.install().wrapped


def test_racing_keeps_lmdeploy_where_its_own_is_faster(pack, monkeypatch):
    """With racing on, each kernel is timed against the implementation LMDeploy's build_op returned (here its
    default one, eager torch, which the interpreter cannot beat): LMDeploy's own path computes every call."""
    from lmdeploy.pytorch.nn.activation import SiluAndMul

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    own_norm, own_act = layers()
    st = L.install(pack)
    act = SiluAndMul(inplace=True)  # the first built binds the op: its own path writes into its input (copies)
    norm, _ = layers()
    x, h = inputs()
    r = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_norm(x), atol=0, rtol=0)
        out, res = norm(x, r)
        want, want_res = own_norm(x, r)
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(res, want_res, atol=0, rtol=0)
        torch.testing.assert_close(act(h.clone()), own_act(h), atol=0, rtol=0)
    stats = st.stats()
    assert stats["hits"] == {}
    assert stats["fallbacks"] == {op: {G.R_SLOWER: 1} for op in ("add_rmsnorm", "rmsnorm", "silu_and_mul")}
    assert sorted(s for states in stats["kernels"].values() for s in states) == ["slower"] * 3
    assert all(ours > theirs for [(ours, theirs)] in stats["race_us"].values()) and len(stats["race_us"]) == 3


def test_own_kernel_is_lmdeploys_implementation_of_each_problem():
    """The factory a pack's search times LMDeploy's own kernels with (``ops.STACK_PEERS``): for each layer problem,
    the implementation LMDeploy's backend builds (its default one on this CPU), found by computing, eps included."""
    from kernelsmith_integrations.ops import stack_baselines, stack_peers

    from ks_core.problem_record import exec_problem_source

    assert "lmdeploy" in stack_baselines("lmdeploy")
    module, _, name = stack_peers("lmdeploy")["lmdeploy"].partition(":")
    assert module == "kernelsmith_integrations.lmdeploy" and name == "own_kernel"
    problems = L.layer_problems(norms=[((1, TOKENS, HIDDEN), torch.float32, 1e-5)],
                                silu_and_mul=[((1, TOKENS, 2 * INTER), torch.float32)],
                                residual_norms=[((1, TOKENS, HIDDEN), torch.float32, 1e-6)])
    assert len(problems) == 3
    for p in problems:
        mod = exec_problem_source(p.source, p.name)
        model = mod.Model(*mod.get_init_inputs())
        torch.manual_seed(1)
        xs = [x.float() if x.is_floating_point() else x for x in mod.get_inputs()]
        if len(xs) > 1:
            xs[1] = 1 + 0.1 * torch.randn_like(xs[1])  # a weight that is not all ones
        own = L.own_kernel(model, xs)
        assert own is not None, p.name
        got, want = own(*[x.clone() for x in xs]), model(*[x.clone() for x in xs])
        got = got if isinstance(got, (tuple, list)) else [got]
        want = want if isinstance(want, (tuple, list)) else [want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    # Inputs no LMDeploy op takes: no kernel.
    assert L.own_kernel(model, [torch.randn(3, 5), torch.randn(4, 4)]) is None
