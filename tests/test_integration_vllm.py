"""Serving a pack in vLLM's own layer classes (``RMSNorm`` with and without the residual, ``SiluAndMul``) through
``CustomOp.register_oot``, registered by our ``vllm.general_plugins`` entry point as vLLM's own
``load_general_plugins()`` finds and calls it, on vLLM's CPU platform and the Triton interpreter.

``make test`` installs vLLM's wheel without its dependencies, plus the packages its layer modules import
(docs/serving.md); where it is not importable these tests skip, and under ``CI=true`` they fail."""

from __future__ import annotations

import logging
import zipfile

import pytest
import torch

from integrations import guard as G
from tests.stacks import layer_pack, plugin_module, require_stack

# what vLLM's plugin loader imports: kernelsmith_integrations.vllm where kernelsmith is installed
V = plugin_module("vllm.general_plugins")

HIDDEN, INTER, TOKENS, EPS = 64, 96, 12, 1e-6


@pytest.fixture(scope="module", autouse=True)
def _vllm():
    with pytest.MonkeyPatch.context() as mp:
        # vLLM's CPU platform, as a CPU deployment sets it (before vLLM resolves its platform, on its first import of
        # a layer module): PyPI's vllm is the CUDA build, which resolves to no platform on a host without a GPU
        mp.setenv("VLLM_TARGET_DEVICE", "cpu")
        require_stack("vllm.model_executor.layers.layernorm", "make test installs vllm (docs/serving.md)")
        from vllm.platforms import current_platform

        assert current_platform.is_cpu(), f"vLLM resolved {type(current_platform).__name__}, not its CPU platform"
        yield


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    import vllm.plugins

    for k in G.SERVING_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VLLM_PLUGINS", "kernelsmith")  # only ours, whatever else is installed
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)  # load_general_plugins() runs once per process
    V.unregister()
    yield
    V.unregister()


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """The pack a Llama-style deployment on vLLM needs at {TOKENS} tokens a forward, built by the command line."""
    return layer_pack(tmp_path_factory.mktemp("vllm"), "vllm", HIDDEN, INTER, EPS, TOKENS, "float32")


def layers():
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        torch.manual_seed(0)
        norm = RMSNorm(HIDDEN, EPS, dtype=torch.float32)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
        return norm, SiluAndMul()


def inputs(tokens=TOKENS):
    g = torch.Generator().manual_seed(tokens)
    return (torch.randn(tokens, HIDDEN, generator=g), torch.randn(tokens, HIDDEN, generator=g),
            torch.randn(tokens, 2 * INTER, generator=g))


def test_layers_serve_the_pack_and_match_vllm(pack, monkeypatch):
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.plugins import load_general_plugins

    monkeypatch.setenv(G.ENV_PACK, str(pack))
    load_general_plugins()  # vLLM's own: entry points of vllm.general_plugins, filtered by VLLM_PLUGINS
    st = V.state()
    assert st.refused == "" and st.registered == ["RMSNorm", "SiluAndMul"]
    norm, act = layers()
    assert type(norm).__name__ == "KernelsmithRMSNorm" and type(act).__name__ == "KernelsmithSiluAndMul"
    x, r, h = inputs()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), RMSNorm.forward_native(norm, x), atol=1e-5, rtol=1e-5)
        out, res = norm(x.clone(), r.clone())
        want, want_res = RMSNorm.forward_native(norm, x.clone(), r.clone())
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res, want_res)
        torch.testing.assert_close(act(h), SiluAndMul.forward_native(h), atol=1e-5, rtol=1e-5)
        # another token count, another dtype: vLLM's own implementation
        x5, r5, h5 = inputs(5)
        torch.testing.assert_close(norm(x5), RMSNorm.forward_native(norm, x5))
        torch.testing.assert_close(act(h5), SiluAndMul.forward_native(h5))
        torch.testing.assert_close(act(h.double()), SiluAndMul.forward_native(h.double()))
    assert st.stats()["hits"] == {"add_rmsnorm": 1, "rmsnorm": 1, "silu_and_mul": 1}
    assert st.stats()["fallbacks"] == {"rmsnorm": {"shape": 1}, "silu_and_mul": {"dtype": 1, "shape": 1}}

    V.unregister()
    norm, act = layers()
    assert type(norm) is RMSNorm and type(act) is SiluAndMul


def test_tampered_pack_unknown_version_and_no_configuration(pack, tmp_path, caplog, monkeypatch):
    from vllm.model_executor.layers.layernorm import RMSNorm

    bad = tmp_path / "bad.kspack"
    with zipfile.ZipFile(pack) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename.startswith("vectors/"):
                body = body[:-1] + bytes([body[-1] ^ 1])
            zout.writestr(info, body)
    with caplog.at_level(logging.INFO, logger="kernelsmith.integrations"):
        st = V.register(bad)
    assert st.registered == [] and st.refused.startswith("pack refused")
    lines = [r for r in caplog.records if r.name == "kernelsmith.integrations"]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    assert type(layers()[0]) is RMSNorm

    V.unregister()
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    st = V.register(pack)
    assert st.registered == [] and "0.99.0" in st.refused
    monkeypatch.undo()

    V.unregister()
    assert V.register().refused.startswith("no pack given")  # the plugin is inert unless configured
    V.unregister()
    monkeypatch.setenv(G.ENV_PACK, str(pack))
    assert V.register().registered == ["RMSNorm", "SiluAndMul"]


def test_racing_keeps_vllm_where_its_own_is_faster(pack, monkeypatch):
    """With racing on, each kernel is timed against the method vLLM's dispatcher chose (``forward_native`` on its
    CPU platform, which the interpreter cannot beat): vLLM's own path computes every call."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    st = V.register(pack)
    assert st.registered == ["RMSNorm", "SiluAndMul"]
    norm, act = layers()
    x, r, h = inputs()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), RMSNorm.forward_native(norm, x), atol=0, rtol=0)
        out, res = norm(x.clone(), r.clone())
        want, want_res = RMSNorm.forward_native(norm, x.clone(), r.clone())
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(res, want_res, atol=0, rtol=0)
        torch.testing.assert_close(act(h), SiluAndMul.forward_native(h), atol=0, rtol=0)
    stats = st.stats()
    assert stats["hits"] == {}
    assert stats["fallbacks"] == {op: {G.R_SLOWER: 1} for op in ("add_rmsnorm", "rmsnorm", "silu_and_mul")}
    assert sorted(s for states in stats["kernels"].values() for s in states) == ["slower"] * 3
    assert all(ours > theirs for [(ours, theirs)] in stats["race_us"].values()) and len(stats["race_us"]) == 3


def test_forward_cuda_falls_back_once_and_races_vllms_own(pack, monkeypatch):
    """vLLM's RMSNorm.forward_cuda calls self.forward_native, which is ours: a fallback from our forward_cuda runs
    vLLM's forward_cuda with its own forward_native, counted once; racing times that same path. (On vLLM's CPU
    platform forward_cuda runs the native ops, so it runs here.)"""
    from vllm.model_executor.layers.layernorm import RMSNorm

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    st = V.register(pack)
    norm, _ = layers()
    x, r, _ = inputs()
    x5, _, _ = inputs(5)
    with torch.no_grad():
        torch.testing.assert_close(norm.forward_cuda(x), RMSNorm.forward_native(norm, x), atol=0, rtol=0)
        torch.testing.assert_close(norm.forward_cuda(x5), RMSNorm.forward_native(norm, x5), atol=0, rtol=0)
        out, res = norm.forward_cuda(x.clone(), r.clone())
        want, want_res = RMSNorm.forward_native(norm, x.clone(), r.clone())
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(res, want_res, atol=0, rtol=0)
    stats = st.stats()
    assert stats["fallbacks"] == {"add_rmsnorm": {G.R_SLOWER: 1}, "rmsnorm": {G.R_SLOWER: 1, G.R_SHAPE: 1}}
    assert stats["hits"] == {} and len(stats["race_us"]) == 2
