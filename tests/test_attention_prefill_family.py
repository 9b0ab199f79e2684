"""The causal prefill attention family: which spellings of causal attention it claims (SDPA with ``is_causal``,
RoPE and an empty cache in front; the same written out with a mask built in the graph, grouped heads repeated by
``repeat_interleave`` or ``expand`` + ``reshape``), which it leaves (decode, masks that are not exactly causal,
masks the graph does not build), every variant at its defaults and at other tiles accepted by the real judge
(interpreter backend) on sequences that no block size divides, and a short search that stores a verified kernel
from this family's seeds alone."""

from __future__ import annotations

import pytest

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.attention import PREFILL_PROBLEMS, by_hand, decode_problem, prefill_source
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, family_of, templates_for
from tests.template_judging import judge_all


@pytest.fixture(scope="module")
def judge():
    """The interpreter judge, on inputs from a fixed seed. On fresh draws, the fp32 grouped-query attention's re-check
    on the large-magnitude set left one element of 1,184 past the fp32 bound in one of 11 runs
    (docs/findings.md): what these tests check is that each form is accepted, on the same inputs every run."""
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(backend="triton-interpret", trials=3, seed=20261129)) as j:
        yield j


def problem(name: str):
    return problem_from_source(PREFILL_PROBLEMS[name][0], name=name)


@pytest.mark.parametrize("name, form, heads, additive, q_kind", [
    ("prefill_sdpa_gqa", "sdpa", (1, 2, 1, 37, 16), False, "plain"),
    ("prefill_sdpa_rope_empty_cache_bf16", "sdpa", (1, 2, 1, 50, 32), False, "rope"),
    ("prefill_sdpa_repeated_kv_fp16", "sdpa", (1, 4, 2, 50, 16), False, "plain"),
    ("prefill_llama_eager_bf16", "explicit", (1, 2, 1, 37, 16), True, "plain"),
    ("prefill_nanogpt_fp32", "explicit", (1, 2, 2, 50, 32), False, "plain"),
    ("prefill_repeat_interleave_fp16", "explicit", (2, 2, 1, 37, 16), True, "plain"),
])
def test_causal_attention_is_claimed_with_its_shape(name, form, heads, additive, q_kind) -> None:
    fm = classify(problem(name))
    assert fm is not None and fm.family == "attention_prefill"
    a = fm.attrs
    assert (a["form"], (a["B"], a["H"], a["HK"], a["T"], a["D"]), a["additive"], a["q"]["kind"]) == (
        form, heads, additive, q_kind)
    assert a["k"]["kind"] == q_kind and a["v"]["kind"] == "plain"


def test_scale_and_reads_come_from_the_graph() -> None:
    """The scale is what the graph multiplies by, with the roundings eager applies on the way; the grouped heads
    read their key/value head (no step along the group); heads split from the hidden dim step D elements into it."""
    llama = classify(problem("prefill_llama_eager_bf16")).attrs
    assert llama["scale"] == pytest.approx(16 ** -0.5)
    assert llama["steps"] == [("round", "bfloat16"), ("mul", 0.25, "bfloat16"), ("round", "float32")]
    grouped = classify(problem("prefill_repeat_interleave_fp16")).attrs
    assert grouped["scale"] == pytest.approx(0.2)
    # k's placeholder is [B, KV, T, D] with one key/value head: both query heads read it
    assert grouped["k"]["x"]["cols"] == [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    nano = classify(problem("prefill_nanogpt_fp32")).attrs
    assert nano["scale"] == pytest.approx(32 ** -0.5)
    # q's placeholder is [B, T, NH * D] (B = 1: no step): head h starts h * D into the hidden dim
    assert nano["q"]["x"]["cols"] == [[0, 0, 0], [0, 0, 32], [0, 1, 0], [0, 0, 1]]
    assert nano["perm"] == [0, 2, 1, 3]


@pytest.mark.parametrize("mask_line", [
    "        s = s + torch.full((T, T), float('-inf'), device=q.device).triu(1)",
    "        s = s + torch.full((T, T), -1e9, device=q.device).triu(1)",
    "        i = torch.arange(T, device=q.device)\n        s = s.masked_fill(i[None, :] > i[:, None], float('-inf'))",
    "        s = torch.where(torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), s, float('-inf'))",
])
def test_any_spelling_of_the_causal_mask_is_claimed(mask_line) -> None:
    """The mask is evaluated, not recognised by its ops: the problems above that are not here differ from these
    only in what their mask holds."""
    assert family_of(problem_from_source(prefill_source(by_hand(mask_line)))) == "attention_prefill"


def test_decode_stays_with_the_decode_family() -> None:
    """A few query rows over a cache, without a mask, is decode's; a causal flag over a non-empty cache is neither
    family's (torch aligns that mask to the top left)."""
    assert family_of(decode_problem()) == "attention"
    assert family_of(decode_problem(T=2)) == "attention"
    assert family_of(decode_problem(extra="is_causal=True, ")) is None


def test_templates_offer_both_variants_and_skip_masked_blocks() -> None:
    fm = classify(problem("prefill_sdpa_gqa"))
    fm.target = "cuda"
    (t,) = templates_for(fm)
    assert t.variants(fm) == ["diagonal", "masked"]
    for v in t.variants(fm):
        src_ = t.render(fm, t.default(fm, v, "cuda"), v)
        # the walk stops at the block's last row: blocks above the diagonal are never loaded
        assert "hi = tl.minimum(m0 + BLOCK_M, T)" in src_ and "range(lo, hi, BLOCK_N)" in src_
        assert ("range(0, lo, BLOCK_N)" in src_) == (v == "diagonal")
        assert all(t.feasible(fm, p, v) for p in [t.default(fm, v, "cuda"), *t.alternates(fm, v, "cuda")])


def test_sdpa_forms_are_accepted(judge) -> None:
    # BLOCK_M 16 under BLOCK_N 32: a query block ends inside a key block, and the diagonal walk starts masked
    judge_all(judge, [("prefill_sdpa_gqa", problem("prefill_sdpa_gqa"), True),
                       ("prefill_sdpa_gqa_alt", problem("prefill_sdpa_gqa"), True, {"BLOCK_M": 16, "BLOCK_N": 32}),
                       ("prefill_sdpa_rope_empty_cache_bf16", problem("prefill_sdpa_rope_empty_cache_bf16"), True),
                       ("prefill_sdpa_repeated_kv_fp16", problem("prefill_sdpa_repeated_kv_fp16"), True)])


def test_written_out_forms_are_accepted(judge) -> None:
    judge_all(judge, [(n, problem(n), True) for n in
                       ("prefill_llama_eager_bf16", "prefill_nanogpt_fp32", "prefill_repeat_interleave_fp16")])


def test_written_out_forms_are_accepted_at_other_tiles(judge) -> None:
    judge_all(judge, [("prefill_llama_eager_bf16_alt", problem("prefill_llama_eager_bf16"), True,
                        {"BLOCK_M": 16, "BLOCK_N": 32}),
                       ("prefill_nanogpt_fp32_alt", problem("prefill_nanogpt_fp32"), True,
                        {"BLOCK_M": 64, "BLOCK_N": 16})])


def test_search_from_the_family_seeds_stores_a_verified_kernel(judge, tmp_path) -> None:
    p = problem("prefill_llama_eager_bf16")
    store = KernelStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        cfg = EvolveConfig(budget=3, backend="triton-interpret", inductor_seeds=False, final_candidates=1)
        summary = evolve_problem(p, cfg, store, judge=judge, progress=False)
        assert summary.family == "attention_prefill"
        assert summary.best is not None and summary.best.status == "verified"
        assert "_prefill_fwd" in summary.best.source
        assert [k.source for k in store.kernels(p.key, status="verified")] == [summary.best.source]
    finally:
        store.close()
