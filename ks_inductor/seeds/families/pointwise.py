"""Pointwise chains (SiLU/GELU-and-mul, activation chains, broadcast arithmetic): one kernel over the output's
elements. Inputs that already have the output's shape and layout are read at the flat offset; broadcast or
viewed inputs (a bias, a slice of a fused gate/up tensor) through their expanded strides, up to 4-D."""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.families.elements import BROADCAST_HELPER, chain_leaves, element_reads
from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import LEAF_VIEW_OPS, leaf_of
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    SM_COUNT_HELPER,
    Template,
    TemplateError,
    lower_or_decline,
    module_source,
    output_refs,
    rounding_default,
    rounding_space,
    torch_dtype,
)
from ks_inductor.seeds.graph import VIEW_OPS, Graph, Ref
from ks_inductor.seeds.pointwise import is_pointwise, store_expr


def match(graph: Graph) -> dict[str, Any] | None:
    """Pointwise ops only, every output of one shape, with views only between a placeholder and the chain."""
    comp = graph.compute_nodes()
    if not comp or not all(is_pointwise(n) for n in comp):
        return None
    for n in graph.nodes:
        if n.op in VIEW_OPS and n.op not in ("getitem",) and n.op not in LEAF_VIEW_OPS:
            return None
    # Views are only allowed on the way from a placeholder into the chain.
    for n in graph.nodes:
        if n.op in LEAF_VIEW_OPS and leaf_of(graph, Ref(n.name)) is None:
            return None
    if not all(isinstance(o, Ref) and graph.node(o.name) is not None for o in graph.outputs):
        return None
    shapes = {tuple(graph.type_of(o.name).shape) for o in graph.outputs if graph.type_of(o.name)}
    if len(shapes) != 1:
        return None
    return {"outputs": [o.name for o in graph.outputs]}


def kind(graph: Graph, attrs: dict[str, Any]) -> str:
    """``act_mul`` for a gated activation (an activation times another value: SiLU-and-mul, GELU-and-mul), as
    every run records it."""
    act = set(graph.ops()) & {"sigmoid", "gelu", "tanh", "silu", "relu"}
    muls = [n for n in graph.compute_nodes() if n.op == "mul" and len(n.args) == 2
            and all(isinstance(a, Ref) for a in n.args)]
    return "act_mul" if act and muls and len(graph.outputs) == 1 else "pointwise"


class PointwiseTemplate(Template):
    name = "pointwise"
    families = ("pointwise", "act_mul")

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["flat", "persistent"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        s: dict[str, list[Any]] = {"BLOCK": [256, 512, 1024, 2048, 4096, 8192, 16384],
                                   "num_warps": [1, 2, 4, 8, 16], "EVICT": [0, 1]}
        if variant == "persistent":  # stages only pipeline loops
            s["WAVES"] = [1, 2, 4, 8, 16]
            s["num_stages"] = [1, 2, 3]
        return {**s, **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        p: dict[str, Any] = {"BLOCK": 2048, "num_warps": 8, "EVICT": 0}
        if variant == "persistent":
            p["WAVES"] = 4
            p["num_stages"] = 1
        return {**p, **rounding_default(fm)}

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        outs = output_refs(g)
        out_t = g.type_of(outs[0])
        if out_t is None or not 1 <= len(out_t.shape) <= 4 and out_t.shape:
            raise TemplateError("outputs must be 0- to 4-D tensors")
        nodes = list(g.compute_nodes())
        reads = element_reads(fm, chain_leaves(fm, nodes, {n.name for n in nodes}), out_t.shape)
        env = dict(reads.env)
        lines = lower_or_decline(nodes, env)
        big = out_t.numel >= 2**31 - 1
        sig = reads.kernel_params() + [f"out{j}_ptr" for j in range(len(outs))] + ["numel"] + reads.stride_params()
        persistent = variant == "persistent"
        k = ["@triton.jit", f"def _pointwise_kernel({', '.join(sig)}, BLOCK: tl.constexpr):"]
        ind = "    "
        if persistent:
            k += ["    n_blocks = tl.cdiv(numel, BLOCK)",
                  "    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):"]
            ind = "        "
            start = "blk.to(tl.int64) * BLOCK" if big else "blk * BLOCK"
        else:
            start = "tl.program_id(0).to(tl.int64) * BLOCK" if big else "tl.program_id(0) * BLOCK"
        k += [ind + f"offs = {start} + tl.arange(0, BLOCK)", ind + "mask = offs < numel"]
        k += reads.index_lines(ind) + reads.load_lines(ind, bool(params.get("EVICT")))
        k += [ind + ln for ln in lines]
        for j, o in enumerate(outs):
            k.append(ind + f"tl.store(out{j}_ptr + offs, {store_expr(env[o].expr, g.type_of(o).dtype)}, mask=mask)")
        kernel = "\n".join(k)

        f = reads.forward_lines()
        if reads.names:
            dev = "t0.device"
        else:
            f.append(f"shape = {list(out_t.shape)!r}")
            dev = "'cpu'"
        for j, o in enumerate(outs):
            f.append(f"out{j} = torch.empty(shape, dtype={torch_dtype(g.type_of(o).dtype)}, device={dev})")
        f.append("numel = out0.numel()")
        f.append(f"BLOCK = {int(params['BLOCK'])}")
        f.append("n_blocks = triton.cdiv(numel, BLOCK)")
        if persistent:
            f.append(f"grid = (max(1, min(n_blocks, _sm_count(out0) * {int(params['WAVES'])})),)")
        else:
            f.append("grid = (max(1, n_blocks),)")
        f += reads.stride_forward_lines()
        call = reads.call_args() + [f"out{j}" for j in range(len(outs))] + ["numel"] + reads.stride_call_args()
        f.append(f"_pointwise_kernel[grid]({', '.join(call)}, BLOCK=BLOCK, num_warps={int(params['num_warps'])}, "
                 f"num_stages={int(params.get('num_stages', 1))})")
        rets = [f"out{j}" for j in range(len(outs))]
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        helpers = BROADCAST_HELPER + (SM_COUNT_HELPER if persistent else "")
        return module_source(fm, f"Pointwise chain ({variant}), rendered by kernelsmith.", kernel, f, helpers, params)


register(Family("pointwise", priority=110, match=match, templates=(PointwiseTemplate(),),
                kinds=("pointwise", "act_mul"), kind=kind))
