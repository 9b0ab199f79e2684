"""Serving a pack in transformers' own layer classes (LlamaRMSNorm, LlamaMLP, and LlamaAttention's rotary embedding
and attention, in a tiny random LlamaForCausalLM),
under the Triton interpreter: the pack is built by the real pipeline (layer problems -> warm -> export), and every
fallback path leaves the model computing what it computes without us."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import pytest
import torch

from integrations import guard as G
from integrations.transformers import apply_kernelsmith, layer_problems, pack_for_model, remove_kernelsmith
from tests.stacks import require_stack

SEQ = 8
ml = pytest.importorskip("transformers.models.llama.modeling_llama")
ROPE_OWN = ml.apply_rotary_pos_emb  # the model file's own rotary embedding, as imported
SDPA_OWN = ml.ALL_ATTENTION_FUNCTIONS["sdpa"]  # transformers' own attention, as registered


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    require_stack("transformers.models.llama.modeling_llama", "pip install -e '.[dev]' installs transformers")


def tiny_llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random, not all-ones, norm weights: a kernel ignoring the weight must show
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def ids(seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, 96, (2, seq), generator=torch.Generator().manual_seed(seq))


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits


@pytest.fixture(scope="module")
def built(tmp_path_factory, judge):
    from rich.console import Console

    from ks_inductor.evolve import EvolveConfig

    root = tmp_path_factory.mktemp("serve")
    db = str(root / "k.db")
    # Two judgments a problem: one candidate turned down on an unlucky trial draw does not leave a layer unpacked.
    build = pack_for_model(tiny_llama(), [(ids(),)], root / "llama.kspack", db=db, judge=judge,
                           config=EvolveConfig(budget=2, backend="triton-interpret"),
                           console=Console(stderr=True, quiet=True))
    missing = [(i["name"], i.get("status"), i.get("note")) for i in build.warm.to_json()["items"]
               if i["key"] in build.missing]
    assert build.missing == [] and build.export is not None, missing
    return {"pack": root / "llama.kspack", "db": db, "build": build, "root": root}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for k in G.SERVING_ENV:
        monkeypatch.delenv(k, raising=False)


def test_layer_problems_are_the_ops_the_model_runs(built):
    assert sorted((p.name, p.signature()) for p in built["build"].problems) == [
        ("attention", "float32[2, 4, 8, 16], float32[2, 2, 8, 16], float32[2, 2, 8, 16]"),
        ("rmsnorm", "float32[2, 8, 64], float32[64]"),
        ("rope", "float32[2, 4, 8, 16], float32[2, 2, 8, 16], float32[1, 8, 16], float32[1, 8, 16]"),
        ("silu_mul", "float32[2, 8, 128], float32[2, 8, 128]")]
    rope = next(p for p in built["build"].problems if p.name == "rope")
    # q and k as the attention makes them: a view of the projection, heads transposed ahead of positions
    assert [s.stride for s in rope.input_specs[:2]] == [[512, 16, 64, 1], [256, 16, 32, 1]]


def test_swap_matches_and_counts_hits(built):
    model = tiny_llama()
    want = logits(model, ids())
    report = apply_kernelsmith(model, built["pack"])
    assert report.refused == ""
    assert sorted(report.swapped) == sorted(
        [f"model.layers.{i}.{n}" for i in range(2)
         for n in ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")] + ["model.norm"])
    assert report.ops["model.layers.0.mlp"] == ["silu_mul"] and report.ops["model.norm"] == ["rmsnorm"]
    assert report.ops["model.layers.1.self_attn"] == ["rope", "attention"]
    got = logits(model, ids())
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    stats = report.stats()
    assert stats["hits"] == {"attention": 2, "rmsnorm": 5, "rope": 2, "silu_mul": 2}
    assert stats["fallbacks"] == {}
    assert list(stats["kernels"].values()) == [["passed"]] * 4

    assert remove_kernelsmith(model) == 9
    torch.testing.assert_close(logits(model, ids()), want)
    assert report.stats()["hits"] == {"attention": 2, "rmsnorm": 5, "rope": 2, "silu_mul": 2}
    assert ml.apply_rotary_pos_emb is ROPE_OWN
    # the registry holds transformers' own attention again, and no entry of ours over it
    assert ml.ALL_ATTENTION_FUNCTIONS["sdpa"] is SDPA_OWN and "sdpa" not in ml.ALL_ATTENTION_FUNCTIONS._local_mapping


def test_rope_serves_only_the_model_it_was_applied_to(built):
    served, other = tiny_llama(), tiny_llama()
    want = logits(other, ids())
    report = apply_kernelsmith(served, built["pack"])
    assert ml.apply_rotary_pos_emb is not ROPE_OWN  # bound to the dispatcher while a model is served
    assert ml.ALL_ATTENTION_FUNCTIONS["sdpa"] is not SDPA_OWN
    # another model of the same file runs the file's own function, uncounted
    torch.testing.assert_close(logits(other, ids()), want, atol=0, rtol=0)
    assert report.stats()["hits"] == {} and report.stats()["fallbacks"] == {}
    assert remove_kernelsmith(served) == 9 and ml.apply_rotary_pos_emb is ROPE_OWN


def test_rope_call_forms_it_was_not_verified_for_run_the_models_own(built, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaAttention

    q, k = torch.randn(2, 4, SEQ, 16), torch.randn(2, 2, SEQ, 16)
    cos, sin = torch.randn(2, SEQ, 16), torch.randn(2, SEQ, 16)
    own_forward, seen = LlamaAttention.forward, []

    def forward(self, *args, **kwargs):  # an attention that also rotates with an explicit unsqueeze_dim
        seen.append(ml.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1))
        return own_forward(self, *args, **kwargs)

    monkeypatch.setattr(LlamaAttention, "forward", forward)
    model = tiny_llama()
    report = apply_kernelsmith(model, built["pack"])
    logits(model, ids())
    assert len(seen) == 2
    for got in seen:
        torch.testing.assert_close(got, ROPE_OWN(q, k, cos, sin), atol=0, rtol=0)
    assert report.stats()["hits"] == {"attention": 2, "rmsnorm": 5, "rope": 2, "silu_mul": 2}
    assert report.stats()["fallbacks"] == {"rope": {"call form": 2}}
    remove_kernelsmith(model)


def test_a_dropped_model_releases_the_rotary_function(built):
    import gc

    gc.collect()  # the models earlier tests served and dropped
    before = ml.apply_rotary_pos_emb
    assert before is ROPE_OWN
    report = apply_kernelsmith(tiny_llama(), built["pack"])
    assert report.ops["model.layers.0.self_attn"] == ["rope", "attention"]
    assert ml.apply_rotary_pos_emb is not before and ml.ALL_ATTENTION_FUNCTIONS["sdpa"] is not SDPA_OWN
    gc.collect()
    assert ml.apply_rotary_pos_emb is before and ml.ALL_ATTENTION_FUNCTIONS["sdpa"] is SDPA_OWN


def test_single_layer_class(built):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64).eval()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(64))
    report = apply_kernelsmith(norm, built["pack"])
    assert report.swapped == [""]
    x = torch.randn(2, SEQ, 64)
    with torch.no_grad():
        got = norm(x)
        torch.testing.assert_close(got, norm.__dict__["_kernelsmith_original_forward"](x))
        # the same shape laid out densely in another order: the kernel is proven there first, and this one, which
        # reads its input as contiguous, is refused there
        xt = torch.randn(SEQ, 2, 64).transpose(0, 1)
        torch.testing.assert_close(norm(xt), LlamaRMSNorm.forward(norm, xt))
        # the same shape with gaps between its rows: never verified, never proven
        xs = torch.randn(2, SEQ, 80)[..., :64]
        torch.testing.assert_close(norm(xs), LlamaRMSNorm.forward(norm, xs))
        # a wrong dtype
        xd = x.double()
        assert norm(xd).dtype == torch.float64
    [proven] = report.stats()["signatures"].values()
    assert proven == [[0, 1]]
    assert report.stats()["hits"] == {"rmsnorm": 1}
    assert report.stats()["fallbacks"] == {"rmsnorm": {"dtype": 1, "stride": 1, G.R_SIGNATURE: 1}}


def test_unverified_shape_falls_back(built):
    model = tiny_llama()
    want = logits(model, ids(5))
    report = apply_kernelsmith(model, built["pack"])
    torch.testing.assert_close(logits(model, ids(5)), want)
    stats = report.stats()
    assert stats["hits"] == {}
    assert stats["fallbacks"] == {"attention": {"shape": 2}, "rmsnorm": {"shape": 5}, "rope": {"shape": 2},
                                  "silu_mul": {"shape": 2}}


def test_wrong_dtype_falls_back(built):
    model = tiny_llama(torch.bfloat16)
    want = logits(model, ids())
    report = apply_kernelsmith(model, built["pack"])
    assert len(report.swapped) == 9  # the layers compute the pack's ops; only their float32 calls are verified
    torch.testing.assert_close(logits(model, ids()), want, atol=0, rtol=0)
    assert report.stats()["fallbacks"] == {"attention": {"dtype": 2}, "rmsnorm": {"dtype": 5}, "rope": {"dtype": 2},
                                           "silu_mul": {"dtype": 2}}
    assert report.stats()["hits"] == {}


def _flip_stored_byte(src: Path, dst: Path) -> None:
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = next(i for i in zf.infolist() if i.filename.startswith("vectors/"))
    # the stored (uncompressed) entry's data starts after its local header: 30 bytes, the name, the extra field
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.file_size // 2] ^= 0x01
    dst.write_bytes(bytes(data))


def _edit_kernel(src: Path, dst: Path) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename == "kernels/00000.py":
                body = body.replace(b"import torch", b"import  torch", 1)
            zout.writestr(info, body)


@pytest.mark.parametrize("tamper", [_flip_stored_byte, _edit_kernel], ids=["flipped-byte", "edited-kernel"])
def test_tampered_pack_is_refused_and_the_model_works(built, tmp_path, caplog, tamper):
    bad = tmp_path / "bad.kspack"
    tamper(built["pack"], bad)
    model = tiny_llama()
    want = logits(model, ids())
    with caplog.at_level(logging.INFO, logger="kernelsmith.integrations"):
        report = apply_kernelsmith(model, bad)
    assert report.swapped == [] and report.refused.startswith("pack refused")
    lines = [r for r in caplog.records if r.name == "kernelsmith.integrations"]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and "refused" in lines[0].getMessage()
    torch.testing.assert_close(logits(model, ids()), want, atol=0, rtol=0)


def test_unknown_stack_version_keeps_the_stack(built, monkeypatch, caplog):
    import transformers as current  # the module object in sys.modules now, which stack_version() reads

    monkeypatch.setattr(current, "__version__", "99.1.0")
    model = tiny_llama()
    with caplog.at_level(logging.WARNING, logger="kernelsmith.integrations"):
        report = apply_kernelsmith(model, built["pack"])
    assert report.swapped == [] and "99.1.0" in report.refused
    assert any("not a version this integration knows" in r.getMessage() for r in caplog.records)
    assert all("_kernelsmith_original_forward" not in m.__dict__ for m in model.modules())


def test_configured_by_environment(built, monkeypatch, tmp_path):
    from kernel_cache.pack import export_pack
    from kernel_cache.signing import generate_keypair
    from kernel_cache.store import KernelStore

    model = tiny_llama()
    want = logits(model, ids())
    monkeypatch.setenv(G.ENV_PACK, str(built["pack"]))
    report = apply_kernelsmith(model)
    assert len(report.swapped) == 9

    # the kill switch, at load and while serving
    monkeypatch.setenv(G.ENV_DISABLE, "1")
    torch.testing.assert_close(logits(model, ids()), want)
    assert report.stats()["fallbacks"] == {"attention": {"disabled": 2}, "rmsnorm": {"disabled": 5},
                                           "rope": {"disabled": 2}, "silu_mul": {"disabled": 2}}
    assert apply_kernelsmith(tiny_llama()).swapped == []
    monkeypatch.delenv(G.ENV_DISABLE)

    # a trusted key configured: the unsigned pack is refused, the one it signed is served
    priv, pub = generate_keypair(tmp_path / "ks")
    monkeypatch.setenv(G.ENV_TRUSTED_KEYS, str(pub))
    refused = apply_kernelsmith(tiny_llama())
    assert refused.swapped == [] and "unsigned" in refused.refused
    with KernelStore(built["db"]) as s:
        export_pack(s, tmp_path / "signed.kspack", sign_key=priv)
    served = apply_kernelsmith(tiny_llama(), tmp_path / "signed.kspack")
    assert len(served.swapped) == 9 and served.guard.report.signature_checked


def test_kernel_cache_and_packs_without_vectors(built, tmp_path):
    from kernel_cache.pack import export_pack
    from kernel_cache.store import KernelStore

    model = tiny_llama()
    want = logits(model, ids())
    report = apply_kernelsmith(model, db=built["db"])
    assert len(report.swapped) == 9
    torch.testing.assert_close(logits(model, ids()), want, atol=1e-5, rtol=1e-5)
    assert report.stats()["hits"] == {"attention": 2, "rmsnorm": 5, "rope": 2, "silu_mul": 2}

    # a problem too large for golden vectors: its kernel is proven against the layer's own computation instead
    with KernelStore(built["db"]) as s:
        export_pack(s, tmp_path / "novec.kspack", vectors=False)
    report = apply_kernelsmith(model, tmp_path / "novec.kspack")
    torch.testing.assert_close(logits(model, ids()), want, atol=1e-5, rtol=1e-5)
    assert report.stats()["hits"] == {"attention": 2, "rmsnorm": 5, "rope": 2, "silu_mul": 2}
    assert {k.note for ks in report.guard.kernels.values() for k in ks} == {
        "a check against transformers's own computation"}

    # and one that does not compute what the stack computes is never served
    guard, why = G.load_guard("test", tmp_path / "novec.kspack")
    problem = next(p for p in built["build"].problems if p.name == "rmsnorm")
    sig = G.spec_signature(problem.input_specs)
    op = guard.bind("rmsnorm", lambda s: problem.key if s == sig else None, lambda x, w: x * w)
    x, w = (torch.randn(shape, dtype=dt) for shape, dt, _ in sig)
    assert op(x, w) is None and op(x, w) is None
    assert guard.stats()["fallbacks"] == {"rmsnorm": {"failed its device check": 2}}
    assert [k.state for k in guard.kernels[problem.key]] == ["failed"]


def test_layer_problems_follow_the_deployment_shapes():
    before = ml.apply_rotary_pos_emb
    problems = layer_problems(tiny_llama(), [(ids(4),), {"input_ids": ids(1)}])
    sigs = sorted((p.name, p.input_specs[0].shape[1]) for p in problems)
    assert sigs == [("attention", 4), ("attention", 4), ("rmsnorm", 1), ("rmsnorm", 4), ("rope", 4), ("rope", 4),
                    ("silu_mul", 1), ("silu_mul", 4)]
    # the positions of a decode step (one token) are the third dim of q
    assert sorted(p.input_specs[0].shape[2] for p in problems if p.name == "rope") == [1, 4]
    assert ml.apply_rotary_pos_emb is before  # recording binds the model file's function only while it runs

    # as generation runs the model: the prompt's prefill, then one-token decode steps over a cache
    generated = layer_problems(tiny_llama(), [lambda m: m.generate(ids(4), max_new_tokens=2, do_sample=False)])
    assert sorted((p.name, p.input_specs[0].shape[-2 if p.name in ("rope", "attention") else 1])
                  for p in generated) == [("attention", 1), ("attention", 4), ("rmsnorm", 1), ("rmsnorm", 4),
                                          ("rope", 1), ("rope", 4), ("silu_mul", 1), ("silu_mul", 4)]
    # the decode step attends over the cache the prefill left and its own new row
    decode = next(p for p in generated if p.name == "attention" and p.input_specs[0].shape[2] == 1)
    assert [s.shape for s in decode.input_specs] == [[2, 4, 1, 16], [2, 2, 5, 16], [2, 2, 5, 16]]
    # and each attention is one the attention templates take, output reshape and transpose included
    from ks_inductor.seeds.families.registry import family_of

    assert sorted(family_of(p) for p in generated if p.name == "attention") == ["attention", "attention_prefill"]


def generation(new: int, **kwargs):
    return lambda m: m.generate(ids(4), max_new_tokens=new, do_sample=False, pad_token_id=0, output_logits=True,
                                return_dict_in_generate=True, **kwargs)


@pytest.fixture(scope="module")
def generated(tmp_path_factory, judge):
    """A pack of the attention problems a generation meets: its prefill, and its decode step at one cache length
    (the prompt's 4 rows and the step's own)."""
    from rich.console import Console

    from integrations.ops import pack_for_problems
    from ks_inductor.evolve import EvolveConfig

    root = tmp_path_factory.mktemp("serve-generated")
    problems = [p for p in layer_problems(tiny_llama(), [generation(2)]) if p.name == "attention"]
    build = pack_for_problems(problems, root / "attention.kspack", db=str(root / "k.db"), judge=judge,
                              # two candidates: what these tests check is serving, which one failed candidate
                              # should not take away
                              config=EvolveConfig(budget=2, backend="triton-interpret"),
                              console=Console(stderr=True, quiet=True), stack="transformers")
    assert build.missing == [] and build.export is not None, [(i.name, i.signature, i.status, i.note)
                                                              for i in build.warm.items]
    decode = next(p for p in problems if p.input_specs[0].shape[2] == 1)
    return {"pack": root / "attention.kspack", "decode": decode}


def test_attention_serves_every_cache_length_of_a_generation(generated):
    model = tiny_llama()
    want = generation(6)(model)
    report = apply_kernelsmith(model, generated["pack"])
    assert report.ops["model.layers.0.self_attn"] == ["attention"]
    assert "rope" in report.skipped["model.layers.0.self_attn"]  # this pack has no rotary kernel
    got = generation(6)(model)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # two layers, each a prefill and five decode steps: cache lengths 5 (the problem's) to 9
    stats = report.stats()
    assert stats["hits"] == {"attention": 12} and stats["fallbacks"] == {}
    proven = {generated["decode"].key[:12]: [[4, 0]]}  # lengths 6 to 9, each proven once before it served
    assert stats["signatures"] == proven
    generation(6)(model)
    assert report.stats()["hits"] == {"attention": 24} and report.stats()["signatures"] == proven

    # a padded batch calls attention with a mask, which no kernel was verified for: transformers' own runs
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[0, 0] = 0
    remove_kernelsmith(model)
    want = logits_with(model, mask)
    report = apply_kernelsmith(model, generated["pack"])
    torch.testing.assert_close(logits_with(model, mask), want, atol=0, rtol=0)
    assert report.stats()["hits"] == {} and report.stats()["fallbacks"] == {"attention": {"call form": 2}}
    remove_kernelsmith(model)


def logits_with(model: torch.nn.Module, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids(4), attention_mask=mask).logits


SLEEPER_LENGTHS = Path(__file__).parent / "candidates" / "serving" / "sleeper_attention_lengths.py"


def test_at_a_length_it_is_proven_at_a_kernel_serves_a_plan_recorded_there_never_its_forward(generated, judge,
                                                                                              tmp_path):
    """The exploit: a decode attention whose forward is right at its judged cache length, and at any other length
    right for its first two calls only, the two trials a server proves it on there. Each length the generation
    meets is served by a plan recorded once there and proven there; the forward never runs per call, so the
    generation is the model's own."""
    from kernel_cache.pack import export_pack
    from kernel_cache.record import VERIFIED, KernelRecord
    from kernel_cache.store import KernelStore

    decode = generated["decode"]
    source = SLEEPER_LENGTHS.read_text()
    res = judge.evaluate(decode, source)
    assert res.accepted and res.plan, res.feedback_text()
    with KernelStore(str(tmp_path / "s.db")) as store:
        store.upsert_problem(decode)
        store.add_kernel(KernelRecord(problem_key=decode.key, source=source, backend=judge.fingerprint.backend,
                                      fingerprint=judge.fingerprint.to_json(), status=VERIFIED, timed=False,
                                      trials=res.trials, plan=res.plan))
        export_pack(store, tmp_path / "s.kspack")
    model = tiny_llama()
    want = generation(6)(model)
    report = apply_kernelsmith(model, tmp_path / "s.kspack")
    got = generation(6)(model)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    stats = report.stats()
    # the judged length serves from its judged plan; lengths 6 to 9 each from a plan recorded there, where the
    # forward was still honest when it was recorded (6 and 7), and are refused where it was not (8 and 9)
    assert stats["signatures"] == {decode.key[:12]: [[2, 2]]}, stats
    # (the prefill's attention is no problem of this pack: its two calls are the stack's)
    assert stats["hits"] == {"attention": 6}, stats
    assert stats["fallbacks"] == {"attention": {G.R_SIGNATURE: 4, G.R_SHAPE: 2}}, stats
    remove_kernelsmith(model)


@pytest.mark.gpu
def test_on_a_gpu_a_kernel_at_another_cache_length_serves_a_plan_recorded_there():
    """On a GPU the plan recorded at another cache length compiles and computes the attention there, and the static
    launch plan a served call replays is recorded from it, not from the forward."""
    from integrations.checks import PackKernel, plan_at
    from integrations.launch_plan import make_plan
    from integrations.signature import call_signature, random_inputs
    from kernel_cache.record import KernelRecord

    problems = [p for p in layer_problems(tiny_llama(), [generation(2)]) if p.name == "attention"]
    decode = next(p for p in problems if p.input_specs[0].shape[2] == 1)
    kernel = PackKernel(KernelRecord(problem_key=decode.key, source=SLEEPER_LENGTHS.read_text(), backend="cuda",
                                     fingerprint={}), decode, None)
    dev = torch.device("cuda")
    for n in (9, 130):  # the forward's first two calls away from its judged length: honest when recorded
        q, k, v = (torch.randn(2, heads, rows, 16, device=dev) for heads, rows in ((4, 1), (2, n), (2, n)))
        sig = call_signature([q, k, v])
        runs, why = plan_at(kernel, sig, dev)
        assert why == "" and runs is not None
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
        torch.testing.assert_close(runs(q, k, v), want, atol=1e-4, rtol=1e-4)
        plan, note = make_plan(runs, random_inputs(sig, dev))
        assert plan is not None, note
        torch.testing.assert_close(plan(q, k, v), want, atol=1e-4, rtol=1e-4)


def test_a_kernel_that_computes_otherwise_at_another_length_is_not_served_there(generated):
    from integrations.ops import attention_binding

    decode = generated["decode"]
    guard, why = G.load_guard("test", generated["pack"])
    assert why == ""
    layer = tiny_llama().model.layers[0].self_attn
    own = attention_binding(layer, SDPA_OWN).reference
    sig = G.spec_signature(decode.input_specs)
    length = sig[1][0][2]

    def stack(q, k, v):  # what this stack computes differs from the kernel's result at every other length
        out = own(q, k, v)
        return out if k.shape[2] == length else 2 * out

    op = guard.bind("attention", lambda s: decode.key if s == sig else None, stack, arity=3, free=((1, 2), (2, 2)))
    q, k, v = (torch.randn(shape, dtype=dt) for shape, dt, _ in sig)
    torch.testing.assert_close(op(q, k, v), own(q, k, v), atol=1e-5, rtol=1e-5)
    longer = [torch.randn(2, 2, length + 3, 16) for _ in range(2)]
    assert op(q, *longer) is None and op(q, *longer) is None  # refused there, and proven only once
    stats = guard.stats()
    assert stats["fallbacks"] == {"attention": {G.R_SIGNATURE: 2}} and stats["hits"] == {"attention": 1}
    assert stats["signatures"] == {decode.key[:12]: [[0, 1]]}
    # another length laid out otherwise is proven on its own, and so is refused there too
    relaid = [torch.randn(2, length + 3, 2, 16).transpose(1, 2) for _ in range(2)]
    assert op(q, *relaid) is None and guard.stats()["fallbacks"]["attention"][G.R_SIGNATURE] == 3
    assert guard.stats()["signatures"] == {decode.key[:12]: [[0, 2]]}
    # the problem's own length laid out otherwise: this kernel reads its inputs' strides, is proven, and serves
    same = [torch.randn(2, length, 2, 16).transpose(1, 2) for _ in range(2)]
    torch.testing.assert_close(op(q, *same), own(q, *same), atol=1e-5, rtol=1e-5)
    assert guard.stats()["signatures"] == {decode.key[:12]: [[1, 2]]} and guard.stats()["hits"] == {"attention": 2}
    # a slice of a longer cache (gaps between its heads) is not proven at all
    sliced = [torch.randn(2, 2, length + 8, 16)[:, :, :length + 3] for _ in range(2)]
    assert op(q, *sliced) is None and guard.stats()["fallbacks"]["attention"][G.R_SHAPE] == 1


def test_another_layout_is_raced_in_a_bucket_of_its_own(generated, monkeypatch):
    """With racing on, a kernel proven at its problem's inputs laid out otherwise is raced there once more: the
    layout can be slower to read, so the race its problem won does not speak for it."""
    from integrations.ops import attention_binding

    monkeypatch.setenv(G.ENV_SERVE_RACE, "1")
    monkeypatch.setenv(G.ENV_SERVE_MARGIN, "0")  # any time wins: the problem's own race passes
    decode = generated["decode"]
    guard, why = G.load_guard("test", generated["pack"])
    assert why == ""
    own = attention_binding(tiny_llama().model.layers[0].self_attn, SDPA_OWN).reference
    sig = G.spec_signature(decode.input_specs)
    op = guard.bind("attention", lambda s: decode.key if s == sig else None, own, arity=3, free=((1, 2), (2, 2)))
    q, k, v = (torch.randn(shape, dtype=dt) for shape, dt, _ in sig)
    with torch.no_grad():
        assert op(q, k, v) is not None
        [kernel] = guard.kernels[decode.key]
        assert kernel.race_us is not None and kernel.state == "passed"
        guard.margin = 1e12  # from here on every race is lost
        relaid = [torch.randn(2, sig[1][0][2], 2, 16).transpose(1, 2) for _ in range(2)]
        assert op(q, *relaid) is None and op(q, *relaid) is None  # raced once, then its route remembers
    assert guard.stats()["fallbacks"] == {"attention": {G.R_SLOWER: 2}}
    assert guard.stats()["signatures"] == {decode.key[:12]: [[1, 0]]}  # proven correct there, and slower
    assert len(kernel.bucket_races) == 2 and sorted(bool(v) for v in kernel.bucket_races.values()) == [False, True]
    with torch.no_grad():
        assert op(q, k, v) is not None  # its own layout keeps the race it won


def test_dispatch_sites_give_back_what_they_held():
    """A registry with global and per-instance entries gets its instance entry removed again (the global one shows
    through); a plain mapping and a module attribute get their own function back."""
    import types

    from integrations.transformers import _acquire, _Dispatch, _release, _Site

    def own(*args):
        return "own"

    registry = type(ml.ALL_ATTENTION_FUNCTIONS)()
    plain = {"sdpa": own}
    module = types.SimpleNamespace(apply_rotary_pos_emb=own)
    for holder, name in ((registry, "sdpa"), (plain, "sdpa"), (module, "apply_rotary_pos_emb")):
        site = _Site(holder, name)
        before = site.get()
        first, second = _acquire(site, "rope"), _acquire(site, "rope")
        assert first is second and isinstance(site.get(), _Dispatch) and site.get().original is before
        if before is own:
            assert site.get()(1) == "own"  # no handler set: the site's own function runs
        _release(site)
        assert isinstance(site.get(), _Dispatch)  # one user left
        _release(site)
        assert site.get() is before
    assert "sdpa" not in registry._local_mapping and plain == {"sdpa": own}


def test_signatures_a_kernel_may_be_proven_at():
    from integrations.signature import call_signature, dense_order, free_bucket, provable_at

    free = ((1, 2), (2, 2))
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 5, 16)
    problem = call_signature([q, k, k])
    longer = torch.randn(2, 2, 9, 16)
    assert not provable_at(free, problem, problem)  # the problem's own signature needs no proof
    assert provable_at(free, problem, call_signature([q, longer, longer]))
    assert not provable_at((), problem, call_signature([q, longer, longer]))
    assert not provable_at(free, problem, call_signature([torch.randn(2, 4, 2, 16), longer, longer]))
    assert not provable_at(free, problem, call_signature([q, longer.double(), longer]))
    assert not provable_at(free, problem, call_signature([q, torch.randn(2, 3, 9, 16), longer]))
    sliced = torch.randn(2, 2, 12, 16)[:, :, :9]  # a view with gaps between its heads
    assert dense_order(sliced.shape, sliced.stride()) is None
    assert not provable_at(free, problem, call_signature([q, sliced, longer]))
    # the same sizes laid out densely in another order (a rotary embedding's contiguous output), with or without
    # free dims; an expanded view (overlapping) is not
    relaid = torch.randn(2, 5, 2, 16).transpose(1, 2)
    assert provable_at((), problem, call_signature([q, relaid, k]))
    assert provable_at(free, problem, call_signature([q, relaid, longer]))
    assert not provable_at((), problem, call_signature([q, torch.randn(2, 1, 5, 16).expand(2, 2, 5, 16), k]))
    assert dense_order((2, 4, 1, 16), (64, 16, 64, 1)) == (0, 1, 3)
    # a bucket: the free dims' sizes to a power of two, and each input's layout
    assert free_bucket(free, call_signature([q, longer, longer])) == ((16, 16), ((0, 1, 3), (0, 1, 2, 3),
                                                                                 (0, 1, 2, 3)))
    assert free_bucket(free, problem)[0] == (8, 8)
    assert free_bucket((), call_signature([q, relaid, k]))[1][1] == (0, 2, 1, 3)


def test_a_transformers_pack_is_searched_against_the_models_own_layers_called_one_by_one():
    from integrations.ops import stack_baselines, stack_in_graphs
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.evolver import search_judge_config

    assert stack_baselines("transformers") == ("eager",)  # transformers runs the layers eagerly, never Inductor
    assert stack_baselines("vllm") == ("eager", "inductor")
    jc = search_judge_config(EvolveConfig(baselines=stack_baselines("transformers")))
    assert jc.baselines == jc.final_baselines == ("eager",)
    assert search_judge_config(EvolveConfig()).final_baselines == ("eager", "inductor")
    # generate() launches each layer's call on its own: the call's cost decides, not a CUDA graph's device time,
    # which decides for the engines that capture their decode step.
    assert not stack_in_graphs("transformers") and stack_in_graphs("vllm") and stack_in_graphs("sglang")
    assert not search_judge_config(EvolveConfig(in_graphs=stack_in_graphs("transformers"))).in_graphs
    assert search_judge_config(EvolveConfig()).in_graphs
    with pytest.raises(ValueError, match="liger"):
        search_judge_config(EvolveConfig(baselines=("eager", "liger")))


def test_version_parsing():
    assert G.parse_version("5.24.0.dev0+cpu") == (5, 24, 0)
    assert G.parse_version("0.5.0rc1") == (0, 5, 0)
    assert G.parse_version("") == ()
    assert not G.version_known("x", None, (1,), (2,))


TINY = ["--hf-set", "hidden_size=32", "--hf-set", "intermediate_size=64", "--hf-set", "num_hidden_layers=1",
        "--hf-set", "num_attention_heads=2", "--hf-set", "num_key_value_heads=1", "--hf-set", "vocab_size=64"]


def test_pack_export_says_why_a_problem_is_missing(tmp_path, capsys, monkeypatch):
    """A layer problem the build could not serve is listed with the search's reason, in --json and in the table."""
    from ks_inductor.cli import main

    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    argv = ["pack", "export", "--hf-config", "llama", *TINY, "--batch", "1", "--seq", "1", "--db",
            str(tmp_path / "k.db"), "-o", str(tmp_path / "p.kspack"), "--budget", "1", "--time-limit", "0.001",
            "--backend", "triton-interpret"]
    main([*argv, "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["problems"] and sorted(out["missing"]) == sorted(p["key"] for p in out["problems"])
    assert all(p["why"] == "no candidate was judged (time)" for p in out["problems"]), out["problems"]
    main(argv)
    assert "missing: no candidate was judged (time)" in " ".join(capsys.readouterr().out.split())


def test_pack_export_for_a_model_serves_that_model(tmp_path, capsys, monkeypatch):
    """``kernelsmith pack export --hf-config``: warm, export, and the pack serves the model it was built for."""
    from ks_inductor.cli import main
    from ks_inductor.compiler import backend as B
    from ks_inductor.warm import hf_model, parse_overrides

    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    pack = tmp_path / "llama.kspack"
    rc = main(["pack", "export", "--hf-config", "llama", *TINY, "--batch", "2", "--seq", "3", "--seq", "1",
               "--db", str(tmp_path / "k.db"), "-o", str(pack), "--budget", "2", "--backend", "triton-interpret",
               "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    B.forget_stores()
    assert rc == 0 and out["missing"] == [] and out["kernels"] == 8 and out["with_vectors"] == 8, [
        (p["name"], p["inputs"], p.get("why")) for p in out["problems"] if not p["packed"]]
    assert sorted((p["name"], p["inputs"]) for p in out["problems"] if p["name"] not in ("rope", "attention")) == [
        ("rmsnorm", "float32[2, 1, 32], float32[32]"), ("rmsnorm", "float32[2, 3, 32], float32[32]"),
        ("silu_mul", "float32[2, 1, 64], float32[2, 1, 64]"), ("silu_mul", "float32[2, 3, 64], float32[2, 3, 64]")]
    assert sorted(p["inputs"].split("], ")[0] for p in out["problems"] if p["name"] == "rope") == [
        "float32[2, 2, 1, 16", "float32[2, 2, 3, 16"]

    overrides = parse_overrides([kv for kv in TINY if kv != "--hf-set"])
    model, _ = hf_model("llama", overrides, 2, 3, "float32", "cpu")
    x = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(1))
    want = logits(model, x)
    report = apply_kernelsmith(model, pack)
    assert report.refused == "" and sorted(report.swapped) == [  # the one layer's norms, MLP, attention; the last norm
        "model.layers.0.input_layernorm", "model.layers.0.mlp", "model.layers.0.post_attention_layernorm",
        "model.layers.0.self_attn", "model.norm"]
    torch.testing.assert_close(logits(model, x), want, atol=1e-4, rtol=1e-4)
    assert report.stats()["hits"] == {"attention": 1, "rmsnorm": 3, "rope": 1, "silu_mul": 1}
    remove_kernelsmith(model)


def test_pack_export_for_refuses_mistakes_on_one_line(tmp_path, capsys):
    from ks_inductor.cli import main

    db, out = str(tmp_path / "k.db"), str(tmp_path / "p.kspack")
    for argv, said in ((["--batch", "2"], "--batch applies only with --hf-config MODEL"),
                       (["--stack", "sglang"], "--stack applies only with --hf-config MODEL"),
                       (["--hf-config", "llama", "--key", "abc"], "--key selects kernels from the cache"),
                       (["--hf-config", "no_such_model_type"], "no_such_model_type"),
                       (["--hf-config", "llama", *TINY, "--dtype", "float99"], "unknown dtype 'float99'"),
                       (["--for", "llama", "--hf-set", "hidden_size"], "expected key=value")):
        assert main(["pack", "export", *argv, "--db", db, "-o", out]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1 and said in err, (argv, err)
    assert not (tmp_path / "k.db").exists() and not (tmp_path / "p.kspack").exists()
