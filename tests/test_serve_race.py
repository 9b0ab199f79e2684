"""Racing a pack kernel against the stack's own path before it serves (``integrations.guard``), and the guard's
per-signature decisions on the hot path: under the Triton interpreter a kernel loses to the stack's eager path,
a deliberately slow stack path loses to the kernel, ``auto`` does not race on a CPU, and every fallback reason is
counted as the call that met it."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from integrations import guard as G
from integrations.checks import load_kernel
from integrations.transformers import apply_kernelsmith
from ks_core.settings import Settings
from tests.llama_norm import (  # noqa: F401 - the autouse fixtures
    HIDDEN,
    _no_serving_env,
    _transformers,
    build_norm_pack,
    hidden,
    norm_layer,
    own_output,
)


@pytest.fixture(scope="module")
def pack(tmp_path_factory, judge):
    """A pack holding one kernel: LlamaRMSNorm at (2, 8, 64) float32, built by the real pipeline."""
    return build_norm_pack(tmp_path_factory.mktemp("race"), judge)


# ============================================================================================ racing in a stack


def test_kernel_slower_than_the_stack_falls_back(pack, monkeypatch, caplog):
    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    norm = norm_layer()
    with caplog.at_level(logging.INFO, logger="kernelsmith.integrations"):
        report = apply_kernelsmith(norm, pack)
        assert report.swapped == [""] and report.guard.race
        x = hidden()
        with torch.no_grad():
            got = [norm(x), norm(x)]
    for out in got:  # the stack's own output, exactly
        torch.testing.assert_close(out, own_output(norm, x), atol=0, rtol=0)
    stats = report.stats()
    assert stats["hits"] == {}
    assert stats["fallbacks"] == {"rmsnorm": {G.R_SLOWER: 2}}
    assert list(stats["kernels"].values()) == [["slower"]]
    [[(ours, theirs)]] = stats["race_us"].values()
    assert ours > theirs * report.guard.margin > 0  # the interpreter against eager torch
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert kernel.race_us is not None and f"{kernel.race_us[0]:.1f} µs" in kernel.note
    lines = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert len(lines) == 1 and "transformers's own" in lines[0], lines


def test_kernel_faster_than_a_slow_stack_path_serves(pack, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    norm = norm_layer()
    x = hidden()
    # how long the kernel takes under the interpreter here, so that the slow path is slower by far
    guard, why = G.load_guard("probe", pack)
    [kernel] = [k for ks in guard.kernels.values() for k in ks]
    assert load_kernel(kernel) == ""
    ours_us, _ = G.race(kernel.judged_call, kernel.judged_call, [x, norm.weight.detach()], x.device, rounds=1)
    delay = max(0.002, 4 * ours_us / 1e6)
    calls = []

    def slow_stack_forward(h: torch.Tensor) -> torch.Tensor:  # a test double of a slow stack path
        calls.append(h.shape)
        time.sleep(delay)
        return LlamaRMSNorm.forward(norm, h)

    norm.forward = slow_stack_forward  # the forward installed before the swap is the stack's own path
    report = apply_kernelsmith(norm, pack)
    with torch.no_grad():
        got = norm(x)
    torch.testing.assert_close(got, own_output(norm, x), atol=1e-5, rtol=1e-5)
    stats = report.stats()
    assert stats["hits"] == {"rmsnorm": 1} and stats["fallbacks"] == {}
    assert list(stats["kernels"].values()) == [["passed"]]
    [[(ours, theirs)]] = stats["race_us"].values()
    assert ours * report.guard.margin <= theirs and theirs >= delay * 1e6
    assert calls, "the race timed the layer's own forward"


def test_auto_does_not_race_under_the_interpreter(pack):
    assert Settings.read("serve_race") == "auto"
    norm = norm_layer()
    report = apply_kernelsmith(norm, pack)
    assert not report.guard.race
    x = hidden()
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_output(norm, x), atol=1e-5, rtol=1e-5)
    stats = report.stats()
    assert stats["hits"] == {"rmsnorm": 1} and stats["race_us"] == {}
    assert [k.race_us for ks in report.guard.kernels.values() for k in ks] == [None]


def test_race_settings(monkeypatch, caplog):
    read = Settings.read
    assert [read("serve_race", {G.ENV_SERVE_RACE: v}) for v in ("1", "on", "0", "off", "auto", "bogus")] == [
        "1", "1", "0", "0", "auto", "auto"]
    assert G.racing_on("cuda") and not G.racing_on("cpu")
    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    assert G.racing_on("cpu")
    monkeypatch.setenv(G.ENV_SERVE_RACE, "0")
    assert not G.racing_on("cuda")

    assert G.serve_margin() == 1.03
    monkeypatch.setenv(G.ENV_SERVE_MARGIN, "1.2")
    assert G.serve_margin() == 1.2
    monkeypatch.setenv(G.ENV_SERVE_MARGIN, "fast")
    with caplog.at_level(logging.WARNING, logger="kernelsmith.integrations"):
        assert G.serve_margin() == 1.03
    assert any(G.ENV_SERVE_MARGIN in r.getMessage() for r in caplog.records)


def test_margin_comparison():
    assert G.wins(100.0, 103.0, 1.03)  # exactly the margin: served
    assert not G.wins(100.0, 102.9, 1.03)  # faster, but not by the margin
    assert not G.wins(100.0, 90.0, 1.03)
    assert G.wins(100.0, 100.0, 1.0)
    assert G.wins(50.0, 100.0, 1.5) and not G.wins(70.0, 100.0, 1.5)


def test_a_higher_margin_keeps_the_stack(pack, monkeypatch):
    """The slow stack path of the earlier test, but a margin no kernel can meet: the stack's own path runs."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    monkeypatch.setenv(G.ENV_SERVE_MARGIN, "1e9")
    norm = norm_layer()

    def slow_stack_forward(h: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return LlamaRMSNorm.forward(norm, h)

    norm.forward = slow_stack_forward
    report = apply_kernelsmith(norm, pack)
    with torch.no_grad():
        norm(hidden())
    assert report.stats()["fallbacks"] == {"rmsnorm": {G.R_SLOWER: 1}}


# ============================================================================================ the race itself


def test_race_times_both_sides_and_leaves_inputs_alone():
    x = torch.zeros(16)
    seen = {"ours": 0, "theirs": 0}

    def ours(t: torch.Tensor) -> torch.Tensor:
        seen["ours"] += 1
        return t + 1

    def in_place(t: torch.Tensor) -> torch.Tensor:  # a stack path that writes into its input
        seen["theirs"] += 1
        time.sleep(0.001)
        return t.add_(1)

    ours_us, theirs_us = G.race(ours, G.OnCopies(in_place, (0,)), [x], x.device, rounds=3, calls=4)
    assert theirs_us >= 1000 > ours_us > 0
    assert torch.equal(x, torch.zeros(16))
    # warm-up (2), one call to size the batches, then 3 rounds of batches of at most 4 calls
    assert seen["ours"] == seen["theirs"] and 3 + 3 <= seen["theirs"] <= 3 + 3 * 4


def test_race_batches_shrink_for_slow_calls():
    n = {"calls": 0}

    def slow(*_: torch.Tensor) -> None:
        n["calls"] += 1
        time.sleep(0.01)

    G.race(slow, slow, [torch.zeros(1)], torch.device("cpu"), rounds=5, calls=20, budget_s=0.05)
    assert n["calls"] == 2 * (2 + 1 + 5)  # one call a batch: the race keeps near its budget


# ============================================================================================ per-signature decisions


def _guard_and_op(pack):
    from integrations.ops import key_function, rmsnorm_binding

    norm = norm_layer()
    guard, why = G.load_guard("test", pack)
    assert guard is not None, why
    binding = rmsnorm_binding(norm)
    return norm, guard, guard.bind("rmsnorm", key_function(binding), binding.reference, arity=2)


def _raise(*_: torch.Tensor) -> None:
    raise RuntimeError("launch failed")


def test_a_kernel_that_raises_later_is_decided_again(pack, monkeypatch):
    norm, guard, op = _guard_and_op(pack)
    x, w = hidden(), norm.weight.detach()
    with torch.no_grad():
        assert op(x, w) is not None
        [kernel] = [k for ks in guard.kernels.values() for k in ks]
        judged = kernel.judged
        monkeypatch.setattr(kernel, "judged", _raise)
        assert op(x, w) is None and kernel.state == "broken"
        monkeypatch.setattr(kernel, "judged", judged)
        assert op(x, w) is None  # broken stays broken: no kernel passed for this signature
    assert guard.stats()["hits"] == {"rmsnorm": 1}
    assert guard.stats()["fallbacks"] == {"rmsnorm": {G.R_ERROR: 1, G.R_VECTORS: 1}}


def test_outputs_are_checked_until_they_fit(pack, monkeypatch):
    norm, guard, op = _guard_and_op(pack)
    x, w = hidden(), norm.weight.detach()
    [key] = guard.kernels
    kernel = guard.ready_kernel(key, x.device)
    assert kernel is not None
    judged = kernel.judged
    with torch.no_grad():
        monkeypatch.setattr(kernel, "judged", lambda *a: torch.zeros(3))  # not the problem's outputs
        assert op(x, w) is None and op(x, w) is None
        monkeypatch.setattr(kernel, "judged", judged)
        assert op(x, w) is not None and op(x, w) is not None
        # checked once per kernel and signature: a kernel's output shapes are fixed by its code
        assert all(r.checked for r in op._routes.values())
    assert guard.stats()["fallbacks"] == {"rmsnorm": {G.R_OUTPUT: 2}}
    assert guard.stats()["hits"] == {"rmsnorm": 2}


def test_every_reason_is_counted_as_met(pack, monkeypatch):
    norm, guard, op = _guard_and_op(pack)
    x, w = hidden(), norm.weight.detach()
    op(x, 1.0)  # call form
    op(hidden()[:, :5], w)  # another first shape
    op(x.double(), w.double())  # same shapes, another dtype
    op(torch.randn(2, 8, HIDDEN + 8)[..., :HIDDEN], w)  # same shapes, with gaps between rows: never proven
    op(x, w.to("meta"))  # another device
    op(x.requires_grad_(), w)  # autograd
    monkeypatch.setenv(G.ENV_DISABLE, "1")
    op(x, w)
    monkeypatch.setenv(G.ENV_DISABLE, "0")
    with torch.no_grad():
        assert op(x.detach(), w) is not None
    assert guard.stats()["fallbacks"] == {"rmsnorm": {
        G.R_CALL: 1, G.R_SHAPE: 1, G.R_DTYPE: 1, G.R_STRIDE: 1, G.R_DEVICE: 1, G.R_GRAD: 1, G.R_DISABLED: 1}}
    assert guard.stats()["hits"] == {"rmsnorm": 1}


def test_a_stack_path_that_comes_back_through_the_layer_is_raced(pack, monkeypatch):
    """vLLM's and SGLang's RMSNorm.forward_cuda call self.forward_native, which is the replaced forward: timing
    that own path calls the served op again while its kernel is being raced. That call runs the stack's code,
    uncounted, instead of waiting on the kernel's check."""
    import threading

    from integrations.ops import key_function, rmsnorm_binding

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    norm = norm_layer()
    guard, why = G.load_guard("test", pack)
    binding = rmsnorm_binding(norm)
    nested = []

    def dispatching_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = op(x, w)  # the replaced forward_native, reached from the stack's forward_cuda
        nested.append(out is None)
        return binding.reference(x, w) if out is None else out

    op = guard.bind("rmsnorm", key_function(binding), binding.reference, arity=2, own=dispatching_forward)
    x, w = hidden(), norm.weight.detach()
    got = []
    worker = threading.Thread(target=lambda: got.append(op(x, w)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the race waited on itself"
    assert got == [None] and nested and all(nested)
    assert guard.stats()["fallbacks"] == {"rmsnorm": {G.R_SLOWER: 1}}


# ============================================================================================ kernels a race decides


@pytest.fixture(scope="module")
def race_pack(pack, tmp_path_factory):
    """The same kernel with the verdict of a launch-bound kernel that is not faster on the device by the judge's
    margin (``record.RACE``), exported under a speedup filter no race kernel's figure is held to."""
    import shutil

    from kernel_cache.access import open_store
    from kernel_cache.pack import ExportFilters, export_pack
    from kernel_cache.record import RACE

    root = tmp_path_factory.mktemp("race-status")
    shutil.copyfile(pack.parent / "k.db", root / "k.db")
    with open_store(str(root / "k.db")) as store:
        [rec] = store.kernels(status="verified")
        store.set_status(rec.id, RACE)
        assert export_pack(store, root / "race.kspack", ExportFilters(min_speedup=100.0), vectors=False).kernels == 1
        store.set_status(rec.id, "rejected")
        with pytest.raises(Exception, match="no kernels match"):
            export_pack(store, root / "none.kspack", ExportFilters(), vectors=False)
    return root / "race.kspack"


def test_a_race_kernel_serves_only_where_it_wins_the_load_time_race(race_pack, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    monkeypatch.setenv(G.ENV_SERVE_RACE, "0")
    norm = norm_layer()
    x = hidden()
    report = apply_kernelsmith(norm, race_pack)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_output(norm, x), atol=0, rtol=0)
    assert report.stats()["hits"] == {} and list(report.stats()["kernels"].values()) == [["slower"]]
    [kernel] = [k for ks in report.guard.kernels.values() for k in ks]
    assert "race at load time" in kernel.note, kernel.note

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    norm = norm_layer()

    def slow_stack_forward(h: torch.Tensor) -> torch.Tensor:  # a test double of a slow stack path
        time.sleep(0.05)
        return LlamaRMSNorm.forward(norm, h)

    norm.forward = slow_stack_forward
    report = apply_kernelsmith(norm, race_pack)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), own_output(norm, x), atol=1e-5, rtol=1e-5)
    assert report.stats()["hits"] == {"rmsnorm": 1}
    [[(ours, theirs)]] = report.stats()["race_us"].values()
    assert ours * report.guard.margin <= theirs
