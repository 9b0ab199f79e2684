"""Every template renders a candidate the real judge (interpreter backend) accepts, at small shapes: the other op
families with their first variant, the decode GEMMs in every variant, the structural knobs. The serving ops in
every variant: test_templates_judge_serving.py (a file of its own, so that parallel workers share the load)."""

from __future__ import annotations

from ks_inductor.catalogue import PROBLEM_DIR
from ks_inductor.catalogue.families import FAMILY_PROBLEMS, ROWS11
from ks_inductor.catalogue.sources import SERVING, module, shrink, small_problem
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, configured, template_named, templates_for
from tests.template_judging import judge_all

OTHERS = ["log_softmax", "layernorm_by_hand", "row_sum", "col_mean", "matmul_mish_mish", "bmm_relu", "bias_gelu",
          "gelu_and_mul", "rmsnorm_channels", "instancenorm_by_hand", "l2norm_rows", "linf_norm_channels",
          "softmax_middle_dim", "row_sum_keepdim", "max_over_dim", "min_over_dim_keep", "argmax_middle_dim",
          "argmin_last_keepdim", "mse_loss", "huber_loss", "kl_div_batchmean", "hinge_broadcast", "frobenius_normalize",
          "l1_norm_bf16_keepdim", "cumsum_rows", "cumprod_rows", "cumsum_reverse", "cumsum_exclusive",
          "masked_cumsum_middle_dim", "cumsum_bf16_minus_input"]


FEWEST_LANES = {"min_over_dim_keep": {"BLOCK_R": 128}, "max_over_dim": {"BLOCK_I": 32}}


def test_other_family_templates_are_accepted(judge) -> None:
    judge_all(judge, [(n, problem_from_source(FAMILY_PROBLEMS[n][0], name=n), False, FEWEST_LANES.get(n, {}))
                       for n in OTHERS])


def test_strided_rows_walk_several_ragged_inner_blocks_per_outer_index(judge) -> None:
    """The strided variant with 8 positions per program: 35 inner positions per outer index make 5 blocks, the last
    ragged, over 2 outer indices, so programs map to (outer, block) both ways round."""
    judge_all(judge, [(n, problem_from_source(FAMILY_PROBLEMS[n][0], name=n), True, {"ROWS": 8, "num_warps": 2})
                       for n in ("rmsnorm_channels", "softmax_middle_dim")])


DECODE_MATMULS = ["linear3d_residual", "linear3d_silu_gate", "bmm_shared_weight"]


def test_decode_matmul_regions_are_accepted_in_every_variant(judge) -> None:
    # BLOCK_K 16 over K 40 with two slices: split-K with one full and one ragged slice.
    judge_all(judge, [(n, problem_from_source(FAMILY_PROBLEMS[n][0], name=n), True, {"BLOCK_K": 16, "SPLIT_K": 2})
                       for n in DECODE_MATMULS])


def test_flattened_tma_gemm_walks_several_tiles_per_program(judge) -> None:
    """FLAT=1 finds each tile's epilogue from a counter of its own. 12 tiles with ragged edges over 4 programs (the
    interpreter's SM count): an epilogue on the wrong tile writes the wrong block, which the judge catches."""
    problem = problem_from_source(module("        return F.gelu(self.lin(xs[0]), approximate='tanh')",
                                         "[torch.randn(40, 24)]", "        self.lin = nn.Linear(24, 56)"),
                                  name="linear_gelu")
    fm = classify(problem)
    fm.target = "cpu"
    t = template_named("matmul")
    assert "tma" in t.variants(fm)
    for flat in (0, 1):
        params = {**t.default(fm, "tma", "cpu"), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "FLAT": flat}
        src = t.render(fm, params, "tma")
        assert ("flatten=True" in src) == bool(flat)
        r = judge.evaluate(problem, src)
        assert r.accepted, (flat, r.verdict, r.reasons[:2], r.error)


def test_split_k_is_offered_for_skinny_products_only() -> None:
    skinny = classify(problem_from_source(FAMILY_PROBLEMS["linear3d_residual"][0], name="r"))
    tall = classify(problem_from_source(module("        return xs[0] @ xs[1]", "[torch.randn(600, 8), torch.randn(8, 8)]"),
                                        name="tall"))
    (t,) = templates_for(skinny)
    assert "splitk" in t.variants(skinny) and "splitk" not in t.variants(tall)
    src = t.render(skinny, t.default(skinny, "splitk", "cuda"), "splitk")
    assert "_matmul_partial[" in src and "_matmul_epilogue[" in src


# Structural knobs the embedded mutator can switch on: each must still give a kernel the judge accepts.
STRUCTURAL = {"HTILE": 1, "num_stages": 2, "EVICT": 1, "LOWP": 1}


def test_structural_knobs_are_accepted(judge) -> None:
    # softmax covers the row-wise template (norms share it), and exercises the logsumexp form of LOWP.
    judge_all(judge, [(n, small_problem(n), True, {**STRUCTURAL, **extra})
                       for n, extra in (("rope_bf16", {}), ("softmax_bf16", {"EVICT": 2}), ("cross_entropy_fp32", {}),
                                        ("layernorm_bf16", {"STATS": 1, "EVICT": 2, "LATEVEC": 1, "VEVICT": 1}))])


def test_late_vector_loads_come_after_the_reductions() -> None:
    """LATEVEC=1 loads a norm's weight and bias after the row statistics, so they do not hold registers through
    the reductions; LATEVEC=0 loads them first. (Both forms are judged in the structural-knob test above.)"""
    fm = classify(small_problem("layernorm_bf16"))
    fm.target = "cuda"
    t = template_named("rowwise")
    for late in (0, 1):
        src = t.render(fm, {**t.default(fm, "block", "cuda"), "LATEVEC": late}, "block")
        body = src[src.index("def _row_kernel"):src.index("class ModelNew")]
        vec_loads = [i for i, ln in enumerate(body.splitlines()) if "_ptr + cols, mask=cmask" in ln]
        first_sum = next(i for i, ln in enumerate(body.splitlines()) if "tl.sum(" in ln)
        assert len(vec_loads) == 2
        assert all((i > first_sum) == bool(late) for i in vec_loads), (late, body)


def test_pinned_vector_loads_stand_before_the_rows_behind_a_barrier(judge) -> None:
    """VFIRST=1 puts a barrier between a norm's vector loads and its row loads (what keeps the compiler from sinking
    them); the kernel is still the norm, judged on the interpreter. It is never combined with LATEVEC, which loads the
    vectors after the reductions instead."""
    t = template_named("rowwise")
    for name in ("rmsnorm_bf16", "layernorm_bf16"):
        fm = classify(small_problem(name))
        fm.target = "cuda"
        d = t.default(fm, "block", "cuda")
        body = t.render(fm, {**d, "VFIRST": 1}, "block").split("def _row_kernel")[1].splitlines()
        bar = body.index("    tl.debug_barrier()")
        assert max(i for i, ln in enumerate(body) if "_ptr + cols, mask=cmask" in ln) == bar - 1
        assert bar < min(i for i, ln in enumerate(body) if "r64 * " in ln and "tl.load(" in ln)
        assert "tl.debug_barrier()" not in t.render(fm, d, "block")
        assert not t.feasible(fm, {**d, "VFIRST": 1, "LATEVEC": 1}, "block")
    judge_all(judge, [(n, small_problem(n), False, {"VFIRST": 1, "VEVICT": 1})
                       for n in ("rmsnorm_bf16", "layernorm_bf16")])


def test_vector_cache_hint_marks_the_broadcast_loads_only() -> None:
    """VEVICT=1 asks the caches to keep a norm's weight and bias (evict_last) and leaves the row loads alone;
    softmax, with no broadcast vector, is not offered the knob."""
    t = template_named("rowwise")
    fm = classify(small_problem("layernorm_bf16"))
    fm.target = "cuda"
    for keep in (0, 1):
        src = t.render(fm, {**t.default(fm, "block", "cuda"), "EVICT": 1, "VEVICT": keep}, "block")
        loads = [ln for ln in src.splitlines() if "tl.load(" in ln]
        vec = [ln for ln in loads if "_ptr + cols, mask=cmask" in ln]
        assert len(vec) == 2
        assert all(("evict_last" in ln) == bool(keep) for ln in vec), src
        assert all("evict_last" not in ln for ln in loads if ln not in vec)
    sm = classify(small_problem("softmax_bf16"))
    sm.target = "cuda"
    assert "VEVICT" not in t.space(sm, "block") and "VEVICT" not in t.default(sm, "block", "cuda")


def test_one_pass_layernorm_statistics_survive_a_large_common_offset(tmp_path) -> None:
    """STATS=1 shifts by the row's first value before summing d and d * d; unshifted, E[x^2] - E[x]^2 of rows of
    1000s with one 1008 (bf16's next value) would lose most of fp32's bits. The output must match eager's."""
    import importlib.util

    import torch

    from ks_core.problem_record import exec_problem_source
    # Rows of 4096: long enough that the sums of squares round (bf16 squares summed over short rows are exact).
    problem = problem_from_source(shrink((PROBLEM_DIR / "layernorm_bf16.py").read_text(), batch_size=4, dim=4096))
    fm = classify(problem)
    fm.target = "cpu"
    t = template_named("rowwise")
    assert t.space(fm, "block")["STATS"] == [0, 1]
    pm = exec_problem_source(problem.source)
    ref = pm.Model(*pm.get_init_inputs())
    torch.manual_seed(0)
    x = torch.full_like(pm.get_inputs()[0], 1000.0)
    x[torch.arange(x.shape[0]), torch.randint(1, x.shape[1], (x.shape[0],))] = 1008.0
    with torch.no_grad():
        for prm in ref.parameters():
            prm.uniform_(-2, 2)
        want = ref(x)
    for variant in ("block", "prefetch"):
        src = t.render(fm, {**t.default(fm, variant, "cpu"), "STATS": 1}, variant)
        assert "tl.reduce(" in src
        path = tmp_path / f"ln_stats_{variant}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        new = mod.ModelNew(*pm.get_init_inputs())
        new.load_state_dict(ref.state_dict())
        with torch.no_grad():
            got = new(x)
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_fast_exp_softmax_is_accepted(judge) -> None:
    """FASTEXP is offered for GPU targets only, where its helper is the flushing hardware exp2. Rendered for the
    interpreter the helper is the exact exp2, so the judge checks the rewrite exp(x - m) = 2^(x log2 e - m log2 e)
    in each form the row-wise template emits: softmax, its log-sum-exp form (LOWP), log-softmax."""

    t = template_named("rowwise")
    jobs = []
    log_softmax = problem_from_source(FAMILY_PROBLEMS["log_softmax"][0], name="log_softmax")
    for problem in (small_problem("softmax_bf16"), log_softmax):
        fm = classify(problem)
        fm.target = "cuda"
        assert t.default(fm, "prefetch", "cuda")["FASTEXP"] == 1 and t.space(fm, "block")["FASTEXP"] == [0, 1]
        assert "ex2.approx.ftz.f32" in t.render(fm, t.default(fm, "block", "cuda"), "block")
        fm.target = "cpu"
        assert "FASTEXP" not in t.space(fm, "block")
        for v in t.variants(fm):
            for lowp in (0, 1):
                src = t.render(fm, {**t.default(fm, v, "cpu"), "FASTEXP": 1, "LOWP": lowp}, v)
                assert "_exp2_ftz(" in src and "tl.exp(" not in src and "inline_asm" not in src
                jobs.append((f"{problem.name} {v} LOWP={lowp}", judge.submit(problem, src)))
    failures = [f"{label}: {r.verdict} {r.reasons[:2]} {r.error}" for label, fut in jobs
                if not (r := fut.result()).accepted]
    assert not failures, "\n".join(failures)


def test_template_params_stay_in_their_space() -> None:
    for name in SERVING:
        fm = classify(small_problem(name))
        for t in templates_for(fm):
            for v in t.variants(fm):
                space = t.space(fm, v)
                d = t.default(fm, v, "cuda")
                assert set(d) == set(space), (t.name, v)
                assert t.feasible(fm, d, v), (t.name, v)
                bad = t.coerce(fm, {k: "nonsense" for k in space}, v)
                assert all(bad[k] in space[k] for k in space)


def test_a_named_configuration_lays_its_params_over_the_variants_defaults() -> None:
    import pytest

    fm = classify(small_problem("softmax_bf16"))
    fm.target = "cuda"
    t, v, params = configured(fm, "rowwise/persistent", {"num_stages": 4})
    assert (t.name, v) == ("rowwise", "persistent")
    assert params == {**t.default(fm, "persistent", "cuda"), "num_stages": 4}
    with pytest.raises(KeyError, match="offers block, persistent, prefetch"):
        configured(fm, "rowwise/tma")
    with pytest.raises(KeyError, match="no template named"):
        configured(fm, "nosuch/block")


def test_embedded_mutator_only_proposes_feasible_children() -> None:
    import random

    from ks_inductor.evolve.archive import Program
    from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
    from ks_inductor.evolve.operators import OPERATORS
    from ks_inductor.problem_tracing import load_problem

    # Full size (4096 x 32000): most rows-per-program and warp choices would spill there.
    fm = classify(load_problem(PROBLEM_DIR / "softmax_bf16.py"))
    fm.target = "cuda"
    mut = EmbeddedMutator(fm)
    rng = random.Random(0)
    seed = mut.seeds()[0]
    parent = Program("p0", seed.source_hash, seed.to_json(), {}, 0, True, True)
    kinds = set()
    for _ in range(200):
        m = mut.mutate(parent, rng)
        if m.candidate is None:
            continue
        c = m.candidate
        kinds.add(m.kind)
        assert template_named(c.template).feasible(fm, c.params, c.variant), c.params
        parent = Program(c.id, c.source_hash, c.to_json(), {}, 0, True, True)
    assert "param" in kinds and kinds - {"param"} and kinds - {"param"} <= set(OPERATORS), kinds



def test_prefetching_row_grid_walks_several_ragged_blocks(judge) -> None:
    """The software-pipelined variant: 11 rows in blocks of 2 over 4 programs (the interpreter's SM count), so
    programs carry a prefetched block across iterations and the last block is half empty."""
    problem = problem_from_source(ROWS11, name="rows11")
    fm = classify(problem)
    fm.target = "cpu"
    t = templates_for(fm)[0]
    assert t.name == "rowwise" and "prefetch" in t.variants(fm)
    params = {**t.default(fm, "prefetch", "cpu"), "ROWS": 2, "WAVES": 1, "LOWP": 1, "EVICT": 1}
    src = t.render(fm, params, "prefetch")
    assert "n_p" in src and "for blk in range" in src
    r = judge.evaluate(problem, src)
    assert r.accepted, (r.reasons, r.error)


def test_staged_row_loop_walks_several_ragged_blocks(judge) -> None:
    """The persistent variant with its loads staged by the pipeliner (3 stages on the row loop): 11 rows in blocks
    of 2 over 4 programs, so each program takes several blocks and the last one is half empty."""
    problem = problem_from_source(ROWS11, name="rows11")
    fm = classify(problem)
    fm.target = "cpu"
    t = templates_for(fm)[0]
    params = {**t.default(fm, "persistent", "cpu"), "ROWS": 2, "WAVES": 1, "num_stages": 3, "EVICT": 1}
    src = t.render(fm, params, "persistent")
    assert "tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=3)" in src
    r = judge.evaluate(problem, src)
    assert r.accepted, (r.reasons, r.error)


def test_online_softmax_ignores_minus_infinity_before_the_first_finite_value(tmp_path) -> None:
    """A row whose first chunk is all -inf (masked logits): the running max stays -inf for a chunk, which must
    not poison the sum in either max-tracking mode."""
    import torch

    from ks_inductor.source_module import load_source_module

    problem = small_problem("softmax_bf16")
    fm = classify(problem)
    fm.target = "cpu"
    x = torch.randn(3, 48)
    x[:, :20] = float("-inf")
    x[1, 30] = float("-inf")
    for chunk_max in (0, 1):
        params = {"BLOCK": 16, "num_warps": 1, "num_stages": 1, "CHUNK_MAX": chunk_max, "L2HINT": chunk_max}
        src = template_named("softmax_online").render(fm, params, "online")
        mod = load_source_module(src, f"ks_sm_inf{chunk_max}", str(tmp_path))
        out = mod.ModelNew(-1)(x.to(torch.bfloat16)).float()
        ref = torch.softmax(x.to(torch.bfloat16).float(), dim=-1)
        assert torch.isfinite(out).all(), chunk_max
        torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


LOG_SOFTMAX_50 = module("        return torch.log_softmax(xs[0], dim=-1)", "[torch.randn(5, 50, dtype=torch.bfloat16)]")


def test_both_sweep_orders_walk_several_ragged_chunks(judge) -> None:
    """Rows of 50 in chunks of 16: four chunks, the last one ragged. The backward write sweep (``online_tail``)
    meets the ragged chunk first; both orders are judged correct."""
    problem = problem_from_source(LOG_SOFTMAX_50, name="log_softmax_50")
    fm = classify(problem)
    fm.target = "cpu"
    t = template_named("softmax_online")
    params = {"BLOCK": 16, "num_warps": 1, "num_stages": 1, "CHUNK_MAX": 1, "L2HINT": 1}
    srcs = {v: t.render(fm, params, v) for v in ("online", "online_tail")}
    assert "TAIL=True" in srcs["online_tail"] and "TAIL=False" in srcs["online"]
    for variant, src in srcs.items():
        r = judge.evaluate(problem, src)
        assert r.accepted, (variant, r.reasons, r.error)


def test_unmasked_tiles_are_accepted_where_the_shape_has_no_ragged_edge(judge) -> None:
    """At power-of-two rows and whole row blocks the row-wise and RoPE launches pass EVEN and the kernels drop
    their masks (the small shapes above are all ragged, so they test the masked path)."""
    def problem(name: str, **sizes: int):
        return problem_from_source(shrink((PROBLEM_DIR / f"{name}.py").read_text(), **sizes), name=name)

    over = {"ROWS": 2, "HB": 4, "BLOCK_T": 16}
    ln = problem("layernorm_bf16", batch_size=8, dim=64)
    rope = problem("rope_bf16", batch_size=1, seq_len=32, q_heads=4, k_heads=4)
    # The launches' conditions: 8 rows of 64 in blocks of 2; 32 positions in blocks of 16, 4 heads in groups of 4,
    # half of a 16-wide head a power of two.
    assert [s.shape for s in ln.input_specs][0] == [8, 64]
    assert [s.shape for s in rope.input_specs][:2] == [[1, 4, 32, 16], [1, 4, 32, 16]]
    judge_all(judge, [("layernorm_bf16", ln, True, over), ("rope_bf16", rope, True, over)])


def test_argmax_and_argmin_resolve_ties_infinities_and_nan_as_torch_does(tmp_path) -> None:
    """torch returns the first index of the extreme value and treats NaN as the extreme. Tiles of 8 over rows of 37
    and 1100 values, so a lane's best and the lanes' agreement both matter: ties within and across tiles, rows of
    -inf only (argmax) or +inf only (argmin), a NaN after the true extreme, two NaNs."""
    import torch

    from ks_inductor.source_module import load_source_module

    torch.manual_seed(0)
    cases = {"argmax_middle_dim": (lambda x: torch.argmax(x, dim=1), torch.randint(0, 4, (3, 37, 6)).float(), 1),
             "argmin_last_keepdim": (lambda x: torch.argmin(x, dim=-1, keepdim=True),
                                     torch.randint(0, 5, (5, 1100)).float(), -1)}
    for name, (ref, x, dim) in cases.items():
        fm = classify(problem_from_source(FAMILY_PROBLEMS[name][0], name=name))
        fm.target = "cpu"
        t = template_named("reduction")
        (variant,) = t.variants(fm)
        xv = x.movedim(dim, -1)  # a view whose last dim is the reduced one: edit rows of it
        extreme = float("-inf") if "argmax" in name else float("inf")
        xv[0, ...] = extreme
        xv[1, ..., 20] = float("nan")
        xv[2, ..., 9] = float("nan")
        xv[2, ..., 30] = float("nan")
        for block in (8, 1024):
            params = {**t.default(fm, variant, "cpu"), "BLOCK_R": block}
            mod = load_source_module(t.render(fm, params, variant), "argtest", str(tmp_path))
            got = mod.ModelNew()(x)
            assert got.dtype == torch.int64 and torch.equal(got, ref(x)), (name, block, got, ref(x))


def test_whole_tensor_reductions_walk_several_ragged_blocks_per_program(judge) -> None:
    """Each of 4 programs walks about 11 blocks of 256, the last one ragged: a hinge loss whose masked lanes would
    add 1 each (1 - 0 * 0), and x / ||x|| through all three kernels, in both block orders."""
    judge_all(judge, [(n, problem_from_source(FAMILY_PROBLEMS[n][0], name=n), True,
                       {"BLOCK": 256, "WAVES": 1, "num_warps": 2}) for n in ("hinge_broadcast", "frobenius_normalize")])


def test_scans_carry_their_running_total_across_blocks(judge) -> None:
    """Rows of 300-1000 in blocks of 128 (two rows a program), and a strided dim of 50 in blocks of 8: every line
    is scanned in several blocks, the last one ragged, so a lost carry, a wrong reverse walk or an unshifted
    exclusive read is a wrong output."""
    rows = {"BLOCK_R": 128, "ROWS": 2}
    judge_all(judge, [(n, problem_from_source(FAMILY_PROBLEMS[n][0], name=n), True, rows)
                       for n in ("cumsum_rows", "cumprod_rows", "cumsum_reverse", "cumsum_exclusive",
                                 "cumsum_bf16_minus_input")]
               + [("masked_cumsum_middle_dim",
                   problem_from_source(FAMILY_PROBLEMS["masked_cumsum_middle_dim"][0], name="m"), True,
                   {"BLOCK_R": 8, "BLOCK_I": 16})])
