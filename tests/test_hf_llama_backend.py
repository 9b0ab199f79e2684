"""A small Llama built from a transformers config (random weights, nothing downloaded), compiled with
backend="kernelsmith" against a cache filled by really warming it (the optimizer with the embedded mutator,
kernels verified by the interpreter judge): hits happen, outputs and gradients match eager in a training step,
and changing the batch size recompiles, meets the kernel verified for that size and matches eager too.

Kept cheap for a 2-core CI box (~35 s): one decoder layer of hidden size 32; only the layer's first RMSNorm is
warmed (one judgment per batch size), every other region is a miss left to Inductor; and Inductor runs in its
"lite" mode (below).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from ks_inductor.compiler import backend as B
from ks_inductor.compiler import kernel_ops as ko

transformers = pytest.importorskip("transformers")

# Inductor's "lite" mode (a torch.compile mode) leaves every op it gets to ATen: no C++ kernels to build, so the four
# compiles here (training forward and backward, inference at batch 3, then at batch 2) take ~3 s each instead of
# ~12 s. Everything kernelsmith does is the same (analysis, lookups, the swap, the op and its autograd,
# specialisation); default-mode Inductor around swapped kernels is covered by test_backend_models.py. This test
# also passes in the default mode. One compile thread: on a 2-core box a pool of compile workers is slower.
LITE = "lite" in torch._inductor.list_mode_options()
INDUCTOR = {"compile_threads": 1, **({"kernelsmith.mode": "lite"} if LITE else {})}
BATCHES = (2, 3)
SEQ = 8
VOCAB = 128


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    # Norm weights of ones (the initialisation) would hide a kernel that ignores them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    gen = torch.Generator().manual_seed(1)
    ids = {b: torch.randint(0, VOCAB, (b, SEQ), generator=gen) for b in BATCHES}
    return model, ids


def _is_warmed(problem):
    """The layer's input RMSNorm (no residual add in it; the embedding lookup that feeds it joins its region, as
    Inductor fuses it there too); the other two norms and all matmuls stay misses."""
    return problem.name.startswith(("norm_pow_mean", "norm_embedding_pow_mean"))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """The model, its inputs, a cache that `warm` filled for the chosen regions at both batch sizes, and the keys."""
    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.warm import problems_from_model, warm

    db = str(tmp_path_factory.mktemp("ks") / "kernels.db")
    model, ids = _llama()
    # The judge starts first: its spare workers import torch while the regions are traced.
    with Judge(JudgeConfig.for_search(backend="triton-interpret", trials=2)) as judge:
        problems = []
        for b in BATCHES:
            torch._dynamo.reset()
            problems += [p for p in problems_from_model(model, (ids[b],), db=db) if _is_warmed(p)]
        assert len({p.key for p in problems}) == len(BATCHES), [p.name for p in problems]
        store = KernelStore(db)
        try:
            summary = warm(problems, store, EvolveConfig(budget=1, islands=1, backend="triton-interpret"),
                           judge=judge)
        finally:
            store.close()
    assert [i.status for i in summary.items] == ["found"] * len(BATCHES), summary.to_json()
    yield db, model, ids, [i.key for i in summary.items]
    B.forget_stores()


def _check_hits(report, keys, symbolic):
    """Exactly the warmed region was a hit and was swapped in; it (and the graph) had a symbolic batch or not."""
    assert report.fallback_reason is None and report.variant == "custom_op", report.to_json()
    hits = [r for r in report.regions if r.status == B.HIT]
    assert len(hits) == 1 and hits[0].key in keys and hits[0].kind == "norm", report.to_json()
    assert report.swapped == 1 and hits[0].symbolic == symbolic
    regions = [r for r in report.regions if r.index >= 0]
    assert len(regions) > 5 and any(r.symbolic for r in regions) == symbolic, report.to_json()


def _no_kernel_fell_back(caught, keys):
    """No warning from the backend, and the kernels ran: none of them failed over to the reference region."""
    msgs = [str(w.message) for w in caught if "kernelsmith" in str(w.message)]
    assert not msgs, msgs
    served = [k for k in ko._SERVED.values() if k.record.problem_key in keys]
    assert served and not any(k.disabled for k in served)


def _hit_key(report):
    return next(r.key for r in report.regions if r.status == B.HIT)


def _loss(logits, ids):
    return F.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())


def test_train_step_matches_eager_then_batch_size_changes(warmed):
    db, model, ids, keys = warmed
    torch._dynamo.reset()
    B.clear_reports()
    compiled = torch.compile(model, backend="kernelsmith", options={"kernelsmith.db": db, **INDUCTOR})
    x, x3 = ids[BATCHES[0]], ids[BATCHES[1]]
    model.train()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # a training step at batch 2: forward and backward compiled, the norm kernel in the forward
            logits = compiled(x).logits
            _loss(logits, x).backward()
            got = {n: p.grad.clone() for n, p in model.named_parameters()}
            (report,) = B.compile_reports()
            _check_hits(report, keys, symbolic=False)

            model.zero_grad(set_to_none=True)
            want = model(x).logits
            torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
            _loss(want, x).backward()
            assert got.keys() == {n for n, _ in model.named_parameters()}
            for n, p in model.named_parameters():
                assert p.grad is not None and p.grad.abs().sum() > 0, n
                # tolerance relative to each gradient's scale: some are ~1e-4 in all (measured error: ~1e-7)
                torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5 * p.grad.abs().max().item(),
                                           msg=lambda m, n=n: f"{n}: {m}")

            # inference at batch 3: Dynamo recompiles with a symbolic batch; the norm, warmed for batch 3, is
            # looked up at that size, hits its own kernel and is specialised to it (a guard on the batch)...
            model.eval()
            with torch.no_grad():
                got3 = compiled(x3).logits
                torch.testing.assert_close(got3, model(x3).logits, rtol=1e-5, atol=1e-5)
                assert got3.shape == (BATCHES[1], SEQ, VOCAB)
                assert len(B.compile_reports()) == 2, "batch 3 must recompile"
                report3 = B.compile_reports()[-1]
                _check_hits(report3, keys, symbolic=True)
                # ...so batch 2 in inference does not run the batch-3 kernel: one more compile, with batch 2's
                got2 = compiled(x).logits
                torch.testing.assert_close(got2, model(x).logits, rtol=1e-5, atol=1e-5)
                assert len(B.compile_reports()) == 3, "the batch-3 graph must be specialised to its kernel's batch"
                report2 = B.compile_reports()[-1]
                _check_hits(report2, keys, symbolic=True)
            assert [_hit_key(r) for r in (report, report3, report2)] == [keys[0], keys[1], keys[0]]
        _no_kernel_fell_back(caught, keys)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
        torch._dynamo.reset()
