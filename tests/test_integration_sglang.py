"""Serving a pack in SGLang's own layer classes (``RMSNorm`` with and without the residual, ``SiluAndMul``) through
SGLang's plugin framework: the ``sglang.srt.plugins`` entry point found and run by SGLang's ``load_plugins()``,
whose ``HookType.REPLACE`` hooks replace the layers' forwards; on a CPU, under the Triton interpreter.

SGLang runs in a virtual environment of its own (``.venv-sglang``: the torch it pins and the torchvision its layer
modules import are CUDA builds that load on a CPU, docs/serving.md); ``make test`` makes it and runs this file
there. Where SGLang is not importable these tests skip, and under ``CI=true`` they fail."""

from __future__ import annotations

import logging
import zipfile

import pytest
import torch

from integrations import guard as G
from tests.stacks import layer_pack, plugin_module, require_stack

# what SGLang's plugin loader imports: kernelsmith_integrations.sglang where kernelsmith is installed
S = plugin_module("sglang.srt.plugins")

HIDDEN, INTER, TOKENS, EPS = 64, 96, 12, 1e-6


@pytest.fixture(scope="module", autouse=True)
def _sglang():
    require_stack("sglang.srt.layers.layernorm", "make test (or make test-sglang) runs this file in .venv-sglang")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    import sglang.srt.plugins as plugins

    for k in G.SERVING_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SGLANG_PLUGINS", "kernelsmith")  # only ours, whatever else is installed
    monkeypatch.setattr(plugins, "_plugins_loaded", False)  # load_plugins() runs once per process
    S.unregister()
    yield
    S.unregister()


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """The pack a Llama-style deployment on SGLang needs at 12 tokens a forward, built by the command line."""
    return layer_pack(tmp_path_factory.mktemp("sglang"), "sglang", HIDDEN, INTER, EPS, TOKENS)


def layers():
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(HIDDEN, EPS)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
    return norm, SiluAndMul()


def inputs(tokens=TOKENS):
    g = torch.Generator().manual_seed(tokens)
    return (torch.randn(tokens, HIDDEN, generator=g), torch.randn(tokens, HIDDEN, generator=g),
            torch.randn(tokens, 2 * INTER, generator=g))


def load_plugins():
    """SGLang's own plugin loading: entry points of ``sglang.srt.plugins``, then ``HookRegistry.apply_hooks()``."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return S.state()


def test_plugin_replaces_the_layers_forwards_and_matches_sglang(pack, monkeypatch):
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm

    own_norm, own_act = RMSNorm.forward_native, SiluAndMul.forward_native
    monkeypatch.setenv(G.ENV_PACK, str(pack))
    st = load_plugins()
    assert st.refused == "" and sorted(st.hooked) == sorted(
        f"{cls}.{m}" for cls in (S.NORM, S.ACT) for m in ("forward_native", "forward_cuda"))
    assert RMSNorm.forward_native is not own_norm and RMSNorm.forward_native.__wrapped__ is own_norm
    norm, act = layers()
    x, r, h = inputs()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_norm(norm, x), atol=1e-5, rtol=1e-5)
        out, res = norm(x.clone(), r.clone())
        want, want_res = own_norm(norm, x.clone(), r.clone())
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res, want_res)
        torch.testing.assert_close(act(h), own_act(act, h), atol=1e-5, rtol=1e-5)
        # SGLang dispatched through its own resolution to the replaced forward_native
        assert norm._forward_method.__func__ is RMSNorm.forward_native
        # another token count, another dtype, an argument the kernel does not take: SGLang's own code
        x5, _, h5 = inputs(5)
        torch.testing.assert_close(norm(x5), own_norm(norm, x5))
        torch.testing.assert_close(act(h5), own_act(act, h5))
        torch.testing.assert_close(act(h.double()), own_act(act, h.double()))
        got = norm(x.clone(), r.clone(), post_residual_addition=r.clone())
        torch.testing.assert_close(got, own_norm(norm, x.clone(), r.clone(), r.clone()))
    assert st.stats()["hits"] == {"add_rmsnorm": 1, "rmsnorm": 1, "silu_and_mul": 1}
    assert st.stats()["fallbacks"] == {"rmsnorm": {"shape": 1}, "silu_and_mul": {"dtype": 1, "shape": 1}}
    # what a GPU dispatches to: the replaced forward_cuda serves the same kernels (SGLang's own forward_cuda needs
    # sgl_kernel, which a CPU host does not have, so only verified calls are made here)
    with torch.no_grad():
        torch.testing.assert_close(norm.forward_cuda(x), own_norm(norm, x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(act.forward_cuda(h), own_act(act, h), atol=1e-5, rtol=1e-5)
    assert st.stats()["hits"] == {"add_rmsnorm": 1, "rmsnorm": 2, "silu_and_mul": 2}

    # the kill switch works on a running server
    monkeypatch.setenv(G.ENV_DISABLE, "1")
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_norm(norm, x))
    assert st.stats()["fallbacks"]["rmsnorm"] == {"shape": 1, "disabled": 1}

    S.unregister()
    assert RMSNorm.forward_native is own_norm and SiluAndMul.forward_native is own_act


def test_a_layer_computing_something_else_is_not_served(pack, monkeypatch):
    from sglang.srt.layers.layernorm import RMSNorm

    monkeypatch.setenv(G.ENV_PACK, str(pack))
    st = load_plugins()
    other_eps = RMSNorm(HIDDEN, 1e-5)
    x, _, _ = inputs()
    with torch.no_grad():
        torch.testing.assert_close(other_eps(x), S.state().hooked[f"{S.NORM}.forward_native"](other_eps, x))
    assert st.stats()["hits"] == {} and [k.state for ks in st.guard.kernels.values() for k in ks] == ["unchecked"] * 3


def test_tampered_pack_unknown_version_and_no_configuration(pack, tmp_path, caplog, monkeypatch):
    import sglang
    from sglang.srt.layers.layernorm import RMSNorm

    own = RMSNorm.forward_native
    bad = tmp_path / "bad.kspack"
    with zipfile.ZipFile(pack) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename.startswith("vectors/"):
                body = body[:-1] + bytes([body[-1] ^ 1])
            zout.writestr(info, body)
    monkeypatch.setenv(G.ENV_PACK, str(bad))
    with caplog.at_level(logging.INFO, logger="kernelsmith.integrations"):
        st = load_plugins()
    assert st.hooked == {} and st.refused.startswith("pack refused")
    lines = [r for r in caplog.records if r.name == "kernelsmith.integrations"]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    assert RMSNorm.forward_native is own

    S.unregister()
    monkeypatch.setattr(sglang, "__version__", "0.99.0")
    st = S.register(pack)
    assert st.hooked == {} and "0.99.0" in st.refused
    monkeypatch.undo()

    S.unregister()
    assert S.register().refused.startswith("no pack given")  # the plugin is inert unless configured


def test_racing_keeps_sglang_where_its_own_is_faster(pack, monkeypatch):
    """With racing on, each kernel is timed against the method SGLang dispatched the layer to (``forward_native``
    on a CPU, which the interpreter cannot beat): SGLang's own path computes every call."""
    monkeypatch.setenv(G.ENV_PACK, str(pack))
    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    st = load_plugins()
    own_norm = st.hooked[f"{S.NORM}.forward_native"]
    own_act = st.hooked[f"{S.ACT}.forward_native"]
    norm, act = layers()
    x, r, h = inputs()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_norm(norm, x), atol=0, rtol=0)
        out, res = norm(x.clone(), r.clone())
        want, want_res = own_norm(norm, x.clone(), r.clone())
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(res, want_res, atol=0, rtol=0)
        torch.testing.assert_close(act(h), own_act(act, h), atol=0, rtol=0)
    stats = st.stats()
    assert stats["hits"] == {}
    assert stats["fallbacks"] == {op: {G.R_SLOWER: 1} for op in ("add_rmsnorm", "rmsnorm", "silu_and_mul")}
    assert sorted(s for states in stats["kernels"].values() for s in states) == ["slower"] * 3
    assert all(ours > theirs for [(ours, theirs)] in stats["race_us"].values()) and len(stats["race_us"]) == 3
