"""Op-family classification from the aten graph, and the aten -> Triton pointwise table."""

from __future__ import annotations

import pytest

from ks_inductor.catalogue import PROBLEM_DIR
from ks_inductor.catalogue.families import FAMILY_PROBLEMS
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, family_of
from ks_inductor.seeds.graph import parse_graph
from ks_inductor.seeds.pointwise import PointwiseUnsupported, Val, lower_chain


@pytest.mark.parametrize("name,expected", [
    ("rmsnorm_bf16", "rmsnorm"), ("layernorm_bf16", "layernorm"), ("softmax_bf16", "softmax"),
    ("silu_mul_bf16", "act_mul"), ("rope_bf16", "rope"), ("cross_entropy_fp32", "cross_entropy"),
    ("gemm_gelu_bf16", "matmul"),
])
def test_serving_problems_classify(name: str, expected: str) -> None:
    assert family_of(small_problem(name)) == expected


@pytest.mark.parametrize("name", list(FAMILY_PROBLEMS))
def test_other_families_classify(name: str) -> None:
    src, expected = FAMILY_PROBLEMS[name]
    assert family_of(problem_from_source(src, name=name)) == expected


def test_family_parameters_come_from_the_graph() -> None:
    ce = classify(small_problem("cross_entropy_fp32"))
    assert ce is not None and ce.attrs["reduction"] == "mean" and ce.attrs["ignore_index"] == -100
    rope = classify(small_problem("rope_bf16"))
    assert rope is not None and len(rope.attrs["outputs"]) == 2
    ln = classify(small_problem("layernorm_bf16"))
    assert ln is not None and [e.name for e in ln.state] == ["weight", "bias"]
    assert ln.init_signature.startswith("dim, eps=")
    mm = classify(problem_from_source(FAMILY_PROBLEMS["matmul_mish_mish"][0], "mmm"))
    assert mm is not None and mm.attrs["bias"] is not None and len(mm.attrs["epilogue"]) >= 10


def test_pool_parameters_come_from_the_graph() -> None:
    fm = classify(problem_from_source(FAMILY_PROBLEMS["max_pool1d_dilated"][0], name="p"))
    a = fm.attrs
    assert (a["kind"], a["nd"], a["kernel"], a["stride"], a["padding"], a["dilation"]) == (
        "max", 2, [1, 5], [1, 2], [0, 2], [1, 2])
    assert a["out_shape"] == [2, 3, 17] and a["out_spatial"] == [1, 17] and a["in_spatial"] == [1, 37]
    a = classify(problem_from_source(FAMILY_PROBLEMS["avg_pool2d_ceil_uncounted_pad"][0], name="p")).attrs
    assert a["out_spatial"] == [8, 9] and not a["count_include_pad"] and a["divisor_override"] is None
    a = classify(problem_from_source(FAMILY_PROBLEMS["avg_pool3d_divisor"][0], name="p")).attrs
    assert (a["kernel"], a["stride"], a["padding"], a["divisor_override"], a["dtype"]) == (
        [2, 3, 2], [1, 2, 2], [1, 1, 0], 5, "float32")


def test_graph_parser_reads_constants() -> None:
    g = parse_graph(small_problem("rmsnorm_bf16").graph_text)
    add = next(n for n in g.nodes if n.op == "add")
    assert add.args[1] == pytest.approx(1e-6)
    assert g.type_of(g.outputs[0].name).dtype == "bfloat16"


def test_pointwise_table_lowers_activation_chains() -> None:
    g = parse_graph(problem_from_source(FAMILY_PROBLEMS["matmul_mish_mish"][0], "mmm").graph_text)
    mm = next(n for n in g.nodes if n.op == "addmm")
    env = {mm.name: Val("acc")}
    lines = lower_chain([n for n in g.compute_nodes() if n is not mm], env)
    text = "\n".join(lines)
    assert "tl.exp(" in text and "tl.math.fdiv(" in text and "tl.where(" in text


def test_pointwise_table_refuses_unknown_ops() -> None:
    g = parse_graph(problem_from_source(FAMILY_PROBLEMS["conv"][0], "conv").graph_text)
    with pytest.raises(PointwiseUnsupported):
        lower_chain(g.compute_nodes(), {p: Val(p) for p, _ in g.placeholders})


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_template_defaults_cover_their_search_space(target: str) -> None:
    """The mutator moves a parameter from its current value, and a seed's value is the default's: a knob in the
    space with no default made every parameter mutation of that template fail (LayerNorm's STATS did, on the H200)."""
    from ks_inductor.seeds.families import templates_for

    serving = ["rmsnorm_bf16", "layernorm_bf16", "softmax_bf16", "silu_mul_bf16", "rope_bf16", "cross_entropy_fp32",
               "gemm_gelu_bf16"]
    problems = [small_problem(n) for n in serving] + [problem_from_source(src, name=n)
                                                      for n, (src, fam) in FAMILY_PROBLEMS.items() if fam is not None]
    checked = 0
    for problem in problems:
        fm = classify(problem)
        fm.target = target
        for t in templates_for(fm):
            for v in t.variants(fm):
                d, space = t.default(fm, v, target), t.space(fm, v)
                assert set(space) <= set(d), (problem.name, t.name, v, set(space) - set(d))
                assert all(d[k] in vals for k, vals in space.items()), (problem.name, t.name, v)
                assert t.coerce(fm, {}, v) == {k: d[k] for k in space}
                checked += 1
    assert checked > 20


def test_gpu_seeds_add_alternate_row_shapes_within_the_space() -> None:
    """On a GPU the row-wise block variant is also seeded at the launch shapes next to its default (twice the
    threads, half the rows, streamed rows, the weight kept in cache, and half the threads with the weight's loads
    pinned first), each in the search space, feasible and distinct, and a LayerNorm one more (one-pass statistics);
    the interpreter, whose clock tells shapes nothing, gets the defaults only."""
    from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import template_named

    fm = classify(load_problem(PROBLEM_DIR / "rmsnorm_bf16.py"))
    fm.target = "cpu"
    cpu_seeds = EmbeddedMutator(fm, inductor=False).seeds()
    fm.target = "cuda"
    seeds = EmbeddedMutator(fm, inductor=False).seeds()
    t = template_named("rowwise")
    default = t.default(fm, "block", "cuda")
    extra = [c for c in seeds if c.variant == "block" and c.params != default]
    assert len(seeds) == len(cpu_seeds) + len(extra) and len(extra) == 5
    shapes = {(c.params["ROWS"], c.params["num_warps"], c.params["EVICT"], c.params["VEVICT"], c.params["VFIRST"])
              for c in extra}
    assert (default["ROWS"], default["num_warps"], default["VEVICT"], default["VFIRST"]) == (2, 8, 0, 0)  # 4096 wide
    assert shapes == {(2, 16, 0, 0, 0), (1, 4, 0, 0, 0), (2, 16, 2, 0, 0), (2, 8, 0, 1, 0), (2, 4, 0, 0, 1)}
    space = t.space(fm, "block")
    for c in extra:
        assert all(c.params[k] in space[k] for k in space) and t.feasible(fm, c.params, "block")
    assert len({c.source_hash for c in seeds}) == len(seeds)

    # A LayerNorm that normalizes its input as it is also gets half the tile over half the threads with the vectors
    # pinned and one-pass statistics; an RMSNorm (above) has no statistics knob, so not there.
    fm = classify(load_problem(PROBLEM_DIR / "layernorm_bf16.py"))
    fm.target = "cuda"
    seeds = EmbeddedMutator(fm, inductor=False).seeds()
    default = t.default(fm, "block", "cuda")
    extra = [c.params for c in seeds if c.variant == "block" and c.params != default]
    one_pass = [p for p in extra if p["STATS"] == 1]
    assert len(extra) == 6 and len(one_pass) == 1
    assert (one_pass[0]["ROWS"], one_pass[0]["num_warps"], one_pass[0]["VFIRST"]) == (1, 4, 1)
    assert t.feasible(fm, one_pass[0], "block") and "tl.reduce" in t.render(fm, one_pass[0], "block")


def test_norms_over_other_dims_read_their_rows_in_place() -> None:
    """A norm over the channels of an NCHW tensor is row-wise with strided rows: one variant, a grid over (inner
    blocks, outer) flattened into one grid axis, the input read where it lies (no permute or copy); a softmax over
    a middle dim goes the same way, and the long-row softmax template, whose rows are the last dim, declines it."""
    from ks_inductor.seeds.families import templates_for

    fm = classify(problem_from_source(FAMILY_PROBLEMS["rmsnorm_channels"][0], name="rmsnorm_channels"))
    assert fm is not None and fm.attrs["dims"] == [1, 1]
    (t,) = templates_for(fm)
    assert t.name == "rowwise" and t.variants(fm) == ["strided"]
    src = t.render(fm, t.default(fm, "strided", "cuda"), "strided")
    assert "tl.program_id(0) // inner_blocks" in src and "reshape(outer, n_cols, inner)" in src
    assert "permute" not in src and "contiguous" not in src
    sm = classify(problem_from_source(FAMILY_PROBLEMS["softmax_middle_dim"][0], name="softmax_middle_dim"))
    assert sm is not None and [t.name for t in templates_for(sm)] == ["rowwise"]
    last = classify(problem_from_source(FAMILY_PROBLEMS["log_softmax"][0], name="log_softmax"))
    assert last is not None and "softmax_online" in [t.name for t in templates_for(last)]
