"""Op-family classification from the aten graph, and the aten -> Triton pointwise table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, family_of
from ks_inductor.seeds.graph import parse_graph
from ks_inductor.seeds.pointwise import PointwiseUnsupported, Val, lower_chain

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "benchmarks" / "problems"

SMALL = {"batch_size": 4, "dim": 48, "num_classes": 40, "q_heads": 2, "k_heads": 1, "seq_len": 8,
         "head_dim": 16, "M": 24, "K": 20, "N": 28}


def shrink(src: str, **sizes: int) -> str:
    """The benchmark problems at test shapes: their module-level size constants replaced (``sizes`` over SMALL)."""
    table = {**SMALL, **sizes}
    return re.sub(r"^([A-Za-z_]+) = \d+$", lambda m: f"{m.group(1)} = {table.get(m.group(1), m.group(0).split()[-1])}",
                  src, flags=re.M)


SMALL_FOR = {"rope_bf16": {"batch_size": 2}}


def small_problem(name: str):
    src = shrink((PROBLEMS / f"{name}.py").read_text(), **SMALL_FOR.get(name, {}))
    return problem_from_source(src, name=name)


def module(forward: str, inputs: str, init: str = "", init_args: str = "[]", sig: str = "") -> str:
    return f'''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self{sig}):
        super().__init__()
{init or "        pass"}

    def forward(self, *xs):
{forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_args}
'''


def norm_module(ctor: str, inputs: str, affine: bool = True) -> str:
    """A problem applying the norm layer ``ctor`` to its input; an affine weight and bias drawn at random (not the
    ones and zeros torch starts from, which would hide a missing or misplaced affine step)."""
    init = f"        self.norm = {ctor}"
    if affine:
        init += "\n        nn.init.normal_(self.norm.weight); nn.init.normal_(self.norm.bias)"
    return module("        return self.norm(xs[0])", inputs, init=init)


EXTRA = {
    "log_softmax": (module("        return torch.log_softmax(xs[0], dim=1)", "[torch.randn(4, 40)]"),
                    "log_softmax"),
    "layernorm_by_hand": (module(
        "        x = xs[0]\n        m = x.mean(-1, keepdim=True)\n"
        "        v = ((x - m) ** 2).mean(-1, keepdim=True)\n        return (x - m) / torch.sqrt(v + 1e-5)",
        "[torch.randn(4, 32)]"), "layernorm"),
    "row_sum": (module("        return xs[0].sum(dim=1)", "[torch.randn(4, 40)]"), "reduction"),
    "col_mean": (module("        return xs[0].mean(dim=0)", "[torch.randn(40, 12)]"), "reduction"),
    "matmul_mish_mish": (module(
        "        return F.mish(F.mish(self.linear(xs[0])))", "[torch.randn(8, 16)]",
        "        self.linear = nn.Linear(16, 12)"), "matmul"),
    "bmm_relu": (module("        return torch.relu(torch.bmm(xs[0], xs[1]))",
                        "[torch.randn(2, 8, 12), torch.randn(2, 12, 6)]"), "matmul"),
    "bias_gelu": (module("        return F.gelu(xs[0] + self.bias)", "[torch.randn(6, 10)]",
                         "        self.bias = nn.Parameter(torch.randn(10))"), "pointwise"),
    "gelu_and_mul": (module("        x = xs[0]\n        return F.gelu(x[:, :8]) * x[:, 8:]", "[torch.randn(4, 16)]"),
                     "act_mul"),
    # The matmul regions of a decode step: Linear on 3-D activations with a residual add, the SiLU gate, and
    # the o-projection, which aten can run as bmm against one weight expanded over the batch.
    "linear3d_residual": (module(
        "        return xs[1] + self.lin(xs[0])",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16), torch.randn(4, 1, 24, dtype=torch.bfloat16)]",
        "        self.lin = nn.Linear(40, 24, bias=False, dtype=torch.bfloat16)"), "matmul"),
    "linear3d_silu_gate": (module(
        "        return F.silu(self.lin(xs[0]).float()).to(torch.bfloat16) * xs[1]",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16), torch.randn(4, 1, 24, dtype=torch.bfloat16)]",
        "        self.lin = nn.Linear(40, 24, bias=False, dtype=torch.bfloat16)"), "matmul"),
    "bmm_shared_weight": (module(
        "        x = xs[0]\n        return torch.bmm(x, self.w.t().unsqueeze(0).expand(x.shape[0], 40, 24))",
        "[torch.randn(4, 1, 40, dtype=torch.bfloat16)]",
        "        self.w = nn.Parameter(torch.randn(24, 40, dtype=torch.bfloat16))"), "matmul"),
    # Norms over other dims than the last, as KernelBench writes them: over the channels of an NCHW tensor
    # (strided rows, a ragged inner block, C not a power of two), over trailing dims (flattened rows), by a vector
    # norm; and a softmax over a middle dim.
    "rmsnorm_channels": (module(
        "        x = xs[0]\n        return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)",
        "[torch.randn(2, 12, 5, 7)]"), "rmsnorm"),
    "instancenorm_by_hand": (module(
        "        x = xs[0]\n        m = x.mean(dim=(2, 3), keepdim=True)\n"
        "        v = ((x - m) ** 2).mean(dim=(2, 3), keepdim=True)\n        return (x - m) / torch.sqrt(v + 1e-5)",
        "[torch.randn(2, 3, 4, 5)]"), "layernorm"),
    "l2norm_rows": (module("        return xs[0] / torch.norm(xs[0], p=2, dim=1, keepdim=True)",
                           "[torch.randn(4, 40)]"), "rowwise"),
    "linf_norm_channels": (module(
        "        return xs[0] / xs[0].abs().amax(dim=1, keepdim=True)", "[torch.randn(3, 10, 6)]"), "rowwise"),
    "softmax_middle_dim": (module("        return torch.softmax(xs[0], dim=1)", "[torch.randn(2, 12, 9)]"), "softmax"),
    "max_over_dim": (module("        return torch.max(xs[0], dim=1)[0]", "[torch.randn(3, 10, 6)]"), "reduction"),
    "min_over_dim_keep": (module("        return torch.min(xs[0], dim=2, keepdim=True)[0]", "[torch.randn(3, 10, 6)]"),
                          "reduction"),
    "argmax_is_not_a_reduction_here": (module("        return torch.max(xs[0], dim=1)[1]", "[torch.randn(3, 10)]"),
                                       None),
    # Small integers as floats: the native trial is full of ties, which must resolve to the first index.
    "argmax_middle_dim": (module("        return torch.argmax(xs[0], dim=1)", "[torch.randint(0, 4, (3, 37, 6)).float()]"),
                          "reduction"),
    "argmin_last_keepdim": (module("        return torch.argmin(xs[0], dim=-1, keepdim=True)",
                                   "[torch.randint(0, 5, (5, 1100)).float()]"), "reduction"),
    "argmax_of_everything_is_not_here": (module("        return torch.argmax(xs[0])", "[torch.randn(3, 10)]"), None),
    "row_sum_keepdim": (module("        return xs[0].sum(-1, keepdim=True)", "[torch.randn(4, 40)]"), "reduction"),
    # Whole-tensor reductions: the losses (prologue, then a scalar epilogue) and x / ||x|| (a full-shape epilogue).
    "mse_loss": (module("        return F.mse_loss(xs[0], xs[1])", "[torch.randn(37, 301), torch.randn(37, 301)]"),
                 "total"),
    "huber_loss": (module("        return F.smooth_l1_loss(xs[0], xs[1])", "[torch.randn(5, 40), torch.randn(5, 40)]"),
                   "total"),
    "kl_div_batchmean": (module(
        "        return F.kl_div(torch.log(xs[0]), xs[1], reduction='batchmean')",
        "[torch.randn(4, 40).softmax(-1), torch.randn(4, 40).softmax(-1)]"), "total"),
    # the targets broadcast along the rows, and a masked lane's prologue (1 - 0 * 0) is not zero
    "hinge_broadcast": (module("        return torch.mean(torch.clamp(1 - xs[0] * xs[1], min=0))",
                               "[torch.randn(37, 301), torch.randn(301).sign()]"), "total"),
    "frobenius_normalize": (module("        return xs[0] / torch.norm(xs[0], p='fro')", "[torch.randn(3, 37, 100)]"),
                            "total"),
    "l1_norm_bf16_keepdim": (module(
        "        return torch.linalg.vector_norm(xs[0], ord=1, dim=(0, 1), keepdim=True) * 0.5 + 1",
        "[torch.randn(7, 40).bfloat16()]"), "total"),
    # Scans: forwards over rows, backwards (between flips), exclusive (the cat idiom), over a strided dim with a
    # prologue, in bf16 with an epilogue that reads the input again.
    "cumsum_rows": (module("        return torch.cumsum(xs[0], dim=1)", "[torch.randn(5, 1000)]"), "scan"),
    "cumprod_rows": (module("        return torch.cumprod(xs[0], dim=-1)", "[1 + 0.01 * torch.randn(4, 300)]"),
                     "scan"),
    "cumsum_reverse": (module("        return torch.cumsum(xs[0].flip(1), dim=1).flip(1)", "[torch.randn(5, 700)]"),
                       "scan"),
    "cumsum_exclusive": (module(
        "        x = xs[0]\n        return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1].cumsum(1)], dim=1)",
        "[torch.randn(5, 700)]"), "scan"),
    "masked_cumsum_middle_dim": (module("        return torch.cumsum(xs[0] * xs[1], dim=1)",
                                        "[torch.randn(3, 50, 7), torch.rand(3, 50, 7) > 0.5]"), "scan"),
    "cumsum_bf16_minus_input": (module("        return torch.cumsum(xs[0], dim=-1) - xs[0]",
                                       "[torch.randn(4, 600).bfloat16()]"), "scan"),
    # Pools: the 1-d ones reach aten as 2-d pools of an unsqueezed input; ceil_mode windows overhang the input.
    "max_pool1d_dilated": (module("        return F.max_pool1d(xs[0], 5, stride=2, padding=2, dilation=2)",
                                  "[torch.randn(2, 3, 37)]"), "pool"),
    "max_pool2d_ceil": (module("        return F.max_pool2d(xs[0], 3, stride=2, padding=1, ceil_mode=True)",
                               "[torch.randn(1, 2, 15, 17)]"), "pool"),
    "max_pool3d_bf16": (module("        return F.max_pool3d(xs[0], 2)", "[torch.randn(1, 2, 6, 7, 9).bfloat16()]"),
                        "pool"),
    "avg_pool1d_padded_bf16": (module("        return F.avg_pool1d(xs[0], 4, stride=3, padding=2, ceil_mode=True)",
                                      "[torch.randn(2, 3, 29).bfloat16()]"), "pool"),
    "avg_pool2d_ceil_uncounted_pad": (module(
        "        return F.avg_pool2d(xs[0], 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)",
        "[torch.randn(1, 2, 15, 17)]"), "pool"),
    "avg_pool3d_divisor": (module(
        "        return F.avg_pool3d(xs[0], (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), divisor_override=5)",
        "[torch.randn(1, 2, 5, 8, 7)]"), "pool"),
    # Windows that overlap along the rows (the window variant reuses each input row's partial across output rows).
    "max_pool2d_stride1": (module("        return F.max_pool2d(xs[0], 4, stride=1, padding=1)",
                                  "[torch.randn(1, 2, 21, 19)]"), "pool"),
    "max_pool2d_dilated_rows": (module(
        "        return F.max_pool2d(xs[0], (3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1))",
        "[torch.randn(1, 2, 17, 23)]"), "pool"),
    "avg_pool3d_overlap": (module("        return F.avg_pool3d(xs[0], 3, stride=(2, 1, 2), padding=1)",
                                       "[torch.randn(1, 2, 7, 9, 11)]"), "pool"),
    # Long contiguous groups: group norm, layer norm over trailing dims, instance norm (through batch norm).
    "group_norm_affine": (norm_module("nn.GroupNorm(3, 6)", "[torch.randn(2, 6, 5, 7) * 3 + 40]"), "group_norm"),
    "layer_norm_3d": (norm_module("nn.LayerNorm((4, 6, 7))", "[torch.randn(3, 4, 6, 7)]"), "group_norm"),
    "instance_norm": (norm_module("nn.InstanceNorm2d(3)", "[torch.randn(2, 3, 9, 11)]", affine=False), "group_norm"),
    # Batch norm in training mode: a group is a channel, one strided segment per batch entry; running statistics.
    "batch_norm_2d": (norm_module("nn.BatchNorm2d(4, momentum=0.3)", "[torch.randn(3, 4, 5, 7) * 3 + 40]"),
                      "group_norm"),
    "batch_norm_1d_plain": (norm_module("nn.BatchNorm1d(3, affine=False)", "[torch.randn(5, 3, 9).bfloat16()]",
                                        affine=False), "group_norm"),
    "batch_norm_untracked": (norm_module("nn.BatchNorm1d(6, track_running_stats=False)", "[torch.randn(4, 6, 11)]"),
                             "group_norm"),
    "max_pool_indices_are_not_here": (module("        return F.max_pool2d(xs[0], 2, return_indices=True)",
                                             "[torch.randn(1, 2, 6, 6)]"), None),
    "cummax_is_not_here": (module("        return torch.cummax(xs[0], dim=1)[0]", "[torch.randn(3, 10)]"), None),
    "amax_of_everything_is_not_here": (module("        return xs[0].amax()", "[torch.randn(3, 10)]"), None),
    "two_totals_are_not_here": (module("        return xs[0].sum() + xs[1].mean()",
                                       "[torch.randn(3, 10), torch.randn(3, 10)]"), None),
    "conv": (module("        return F.conv2d(xs[0], xs[1])", "[torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)]"),
             None),
}


@pytest.mark.parametrize("name,expected", [
    ("rmsnorm_bf16", "rmsnorm"), ("layernorm_bf16", "layernorm"), ("softmax_bf16", "softmax"),
    ("silu_mul_bf16", "act_mul"), ("rope_bf16", "rope"), ("cross_entropy_fp32", "cross_entropy"),
    ("gemm_gelu_bf16", "matmul"),
])
def test_serving_problems_classify(name: str, expected: str) -> None:
    assert family_of(small_problem(name)) == expected


@pytest.mark.parametrize("name", list(EXTRA))
def test_other_families_classify(name: str) -> None:
    src, expected = EXTRA[name]
    assert family_of(problem_from_source(src, name=name)) == expected


def test_family_parameters_come_from_the_graph() -> None:
    ce = classify(small_problem("cross_entropy_fp32"))
    assert ce is not None and ce.attrs["reduction"] == "mean" and ce.attrs["ignore_index"] == -100
    rope = classify(small_problem("rope_bf16"))
    assert rope is not None and len(rope.attrs["outputs"]) == 2
    ln = classify(small_problem("layernorm_bf16"))
    assert ln is not None and [e.name for e in ln.state] == ["weight", "bias"]
    assert ln.init_signature.startswith("dim, eps=")
    mm = classify(problem_from_source(EXTRA["matmul_mish_mish"][0], "mmm"))
    assert mm is not None and mm.attrs["bias"] is not None and len(mm.attrs["epilogue"]) >= 10


def test_pool_parameters_come_from_the_graph() -> None:
    fm = classify(problem_from_source(EXTRA["max_pool1d_dilated"][0], name="p"))
    a = fm.attrs
    assert (a["kind"], a["nd"], a["kernel"], a["stride"], a["padding"], a["dilation"]) == (
        "max", 2, [1, 5], [1, 2], [0, 2], [1, 2])
    assert a["out_shape"] == [2, 3, 17] and a["out_spatial"] == [1, 17] and a["in_spatial"] == [1, 37]
    a = classify(problem_from_source(EXTRA["avg_pool2d_ceil_uncounted_pad"][0], name="p")).attrs
    assert a["out_spatial"] == [8, 9] and not a["count_include_pad"] and a["divisor_override"] is None
    a = classify(problem_from_source(EXTRA["avg_pool3d_divisor"][0], name="p")).attrs
    assert (a["kernel"], a["stride"], a["padding"], a["divisor_override"], a["dtype"]) == (
        [2, 3, 2], [1, 2, 2], [1, 1, 0], 5, "float32")


def test_graph_parser_reads_constants() -> None:
    g = parse_graph(small_problem("rmsnorm_bf16").graph_text)
    add = next(n for n in g.nodes if n.op == "add")
    assert add.args[1] == pytest.approx(1e-6)
    assert g.type_of(g.outputs[0].name).dtype == "bfloat16"


def test_pointwise_table_lowers_activation_chains() -> None:
    g = parse_graph(problem_from_source(EXTRA["matmul_mish_mish"][0], "mmm").graph_text)
    mm = next(n for n in g.nodes if n.op == "addmm")
    env = {mm.name: Val("acc")}
    lines = lower_chain([n for n in g.compute_nodes() if n is not mm], env)
    text = "\n".join(lines)
    assert "tl.exp(" in text and "tl.math.fdiv(" in text and "tl.where(" in text


def test_pointwise_table_refuses_unknown_ops() -> None:
    g = parse_graph(problem_from_source(EXTRA["conv"][0], "conv").graph_text)
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
                                                      for n, (src, fam) in EXTRA.items() if fam is not None]
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

    fm = classify(load_problem(PROBLEMS / "rmsnorm_bf16.py"))
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
    fm = classify(load_problem(PROBLEMS / "layernorm_bf16.py"))
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

    fm = classify(problem_from_source(EXTRA["rmsnorm_channels"][0], name="rmsnorm_channels"))
    assert fm is not None and fm.attrs["dims"] == [1, 1]
    (t,) = templates_for(fm)
    assert t.name == "rowwise" and t.variants(fm) == ["strided"]
    src = t.render(fm, t.default(fm, "strided", "cuda"), "strided")
    assert "tl.program_id(0) // inner_blocks" in src and "reshape(outer, n_cols, inner)" in src
    assert "permute" not in src and "contiguous" not in src
    sm = classify(problem_from_source(EXTRA["softmax_middle_dim"][0], name="softmax_middle_dim"))
    assert sm is not None and [t.name for t in templates_for(sm)] == ["rowwise"]
    last = classify(problem_from_source(EXTRA["log_softmax"][0], name="log_softmax"))
    assert last is not None and "softmax_online" in [t.name for t in templates_for(last)]
