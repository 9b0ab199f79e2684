"""Whole-tensor reductions to a scalar (sum, mean, 1- and 2-norms) with the pointwise work around them: the losses
(mean squared error, Huber, KL divergence, hinge) and normalization by a global norm (``x / ||x||``).

Three kernels, in a fixed order, so the result does not depend on scheduling:
- the partial sums: a persistent grid of WAVES programs per SM; each program computes the prologue over its blocks
  and keeps one fp32 accumulator per lane, then writes its partial. The variants order a program's blocks:
  "strided" takes every grid-th block (the programs sweep memory together), "chunked" one contiguous run of blocks.
- the finish: one program adds the partials in order and runs the scalar epilogue (the mean's division, the norm's
  square root, a loss's batch division).
- the apply kernel, when the output has the full shape: the pointwise epilogue over the elements, with the scalars
  it reads loaded once per program.
"""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.families.elements import BROADCAST_HELPER, chain_leaves, element_reads
from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import FLOATS, downstream, in_order, upstream, views_are_leaves
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    MAX_ELEMS_PER_THREAD,
    SM_COUNT_HELPER,
    Template,
    TemplateError,
    block_class,
    elems_per_thread,
    lower_or_decline,
    module_source,
    rounding_default,
    rounding_space,
    torch_dtype,
)
from ks_inductor.seeds.graph import Graph, Node, Ref
from ks_inductor.seeds.pointwise import Val, is_pointwise, round_expr, store_expr

TOTAL_REDUCTIONS = ("sum", "mean", "linalg_vector_norm")


def _norm_order(n: Node) -> Any:
    """The ord of a ``linalg_vector_norm`` (2 where the graph leaves it out), None for other ops."""
    if n.op != "linalg_vector_norm":
        return None
    return n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2)


def _reduces_everything(n: Node, ndim: int) -> bool:
    """Whether ``n`` (sum, mean, or a 1- or 2-norm, with no dtype argument) reduces every dim of its input."""
    if n.kwargs.get("dtype") is not None:
        return False
    if n.op == "linalg_vector_norm":
        if _norm_order(n) not in (1, 2):
            return False
        dims = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim")
    else:
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if dims is None or dims == []:
        return True
    dims = [dims] if isinstance(dims, int) else dims
    return isinstance(dims, list) and all(isinstance(d, int) for d in dims) and \
        sorted(d % ndim for d in dims) == list(range(ndim))


def match(graph: Graph) -> dict[str, Any] | None:
    """One reduction of a whole float value to a scalar (sum, mean, 1- or 2-norm) with pointwise work around it:
    a prologue over the inputs, broadcast into the reduced shape (a loss's differences); a scalar epilogue (the
    batch division of a batchmean); or a full-shape epilogue that reads the scalar (``x / ||x||``).

    The node lists are the three kernels' work: ``prologue`` feeds the partial sums, ``finish`` runs on the
    scalar, ``apply`` writes the full-shape output."""
    comp = graph.compute_nodes()
    reds = [n for n in comp if not is_pointwise(n)]
    if len(reds) != 1 or reds[0].op not in TOTAL_REDUCTIONS:
        return None
    red = reds[0]
    src = red.args[0] if red.args else None
    ts = graph.type_of(src.name) if isinstance(src, Ref) else None
    if ts is None or not ts.shape or ts.dtype not in FLOATS or not _reduces_everything(red, len(ts.shape)):
        return None
    if len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref) or not views_are_leaves(graph):
        return None
    out = graph.outputs[0].name
    prologue = upstream(graph, [red.name], set())
    names = {n.name: n for n in comp}
    after = downstream(comp, red.name)
    scalar = {m for m in after - {red.name} if names[m].type is not None and names[m].type.numel == 1}
    finish = scalar | {c for m in scalar for c in names[m].refs() if c in names and not names[c].refs()}
    for m in finish:
        if any(r not in finish and r != red.name for r in names[m].refs()):
            return None
    if out == red.name or out in finish:
        apply: set[str] = set()
    else:
        apply = upstream(graph, [out], finish | {red.name}) - finish - {red.name} | {out}
    if set(names) != prologue | {red.name} | finish | apply:
        return None
    return {"red": red.name, "src": src.name, "ord": _norm_order(red), "prologue": in_order(comp, prologue),
            "finish": in_order(comp, finish), "apply": in_order(comp, apply), "out": out}


class TotalTemplate(Template):
    name = "total"
    families = ("total",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["strided", "chunked"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        return {"BLOCK": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16],
                "WAVES": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3, 4], **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        return {"BLOCK": 2048, "num_warps": 8, "WAVES": 4, "num_stages": 2, **rounding_default(fm)}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        return elems_per_thread(params["BLOCK"], params["num_warps"]) <= MAX_ELEMS_PER_THREAD // 2

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK"])
        d["persistent"] = True
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g, a = fm.graph, fm.attrs
        red = g.node(a["red"])
        src_t = g.type_of(a["src"])
        out_t = g.type_of(a["out"])
        if red is None or src_t is None or out_t is None:
            raise TemplateError("the reduction's graph is incomplete")
        apply = bool(a["apply"])

        # 1. partial sums over the reduced shape
        pro = fm.nodes("prologue")
        reads = element_reads(fm, chain_leaves(fm, pro + [red], set(a["prologue"])), src_t.shape)
        if not reads.names:
            raise TemplateError("the reduced value reads no input")
        env = dict(reads.env)
        lines = lower_or_decline(pro, env, [red])
        v = env[a["src"]]
        if v.kind != "f":
            raise TemplateError("the reduced value is not a float")
        order = a["ord"]
        term = {1: f"tl.abs({v.expr})", 2: f"{v.expr} * {v.expr}", None: v.expr}[order]
        big = src_t.numel >= 2**31 - 1
        sig = reads.kernel_params() + ["part_ptr", "numel"] + reads.stride_params()
        k = ["@triton.jit", f"def _total_partials({', '.join(sig)}, BLOCK: tl.constexpr):",
             "    pid = tl.program_id(0)",
             "    n_blocks = tl.cdiv(numel, BLOCK)",
             "    acc = tl.zeros([BLOCK], tl.float32)"]
        if variant == "strided":
            k.append("    for blk in range(pid, n_blocks, tl.num_programs(0)):")
        else:
            k += ["    per = tl.cdiv(n_blocks, tl.num_programs(0))",
                  "    for blk in range(pid * per, tl.minimum(pid * per + per, n_blocks)):"]
        ind = "        "
        k.append(ind + f"offs = {'blk.to(tl.int64)' if big else 'blk'} * BLOCK + tl.arange(0, BLOCK)")
        k.append(ind + "mask = offs < numel")
        k += reads.index_lines(ind) + reads.load_lines(ind)
        k += [ind + ln for ln in lines]
        # masked lanes hold the prologue of zeros (1 - 0 * 0 for a hinge loss, log(0) for a KL divergence)
        k += [ind + f"acc += tl.where(mask, {term}, 0.0)",
              "    tl.store(part_ptr + pid, tl.sum(acc, axis=0))"]

        # 2. the finish: the partials in order, then the scalar epilogue
        fin = fm.nodes("finish")
        total = {"mean": "total / numel", "sum": "total"}.get(red.op, "tl.sqrt(total)" if order == 2 else "total")
        env = {red.name: Val(f"x_{red.name}")}
        lines = [f"x_{red.name} = {round_expr(total, red.type.dtype if red.type else 'float32')}"]
        lines += lower_or_decline(fin, env)
        scalars = [n for n in [red.name] + a["finish"] if any(n in g.node(m).refs() for m in a["apply"])]
        k += ["", "", "@triton.jit",
              f"def _total_finish(part_ptr, {'sc_ptr' if apply else 'out_ptr'}, n_parts, numel, "
              "BLOCK_P: tl.constexpr):",
              "    i = tl.arange(0, BLOCK_P)",
              "    total = tl.sum(tl.load(part_ptr + i, mask=i < n_parts, other=0.0), axis=0)"]
        k += ["    " + ln for ln in lines]
        if apply:
            k += [f"    tl.store(sc_ptr + {j}, {env[n].expr})" for j, n in enumerate(scalars)]
        else:
            k.append(f"    tl.store(out_ptr, {store_expr(env[a['out']].expr, out_t.dtype)})")

        # 3. the apply kernel
        f = reads.forward_lines() + [
            "numel = torch.Size(shape).numel()",
            f"BLOCK = {int(params['BLOCK'])}",
            f"n_parts = max(1, min(triton.cdiv(numel, BLOCK), _sm_count(t0) * {int(params['WAVES'])}))",
            "part = torch.empty(n_parts, dtype=torch.float32, device=t0.device)",
        ] + reads.stride_forward_lines()
        call = reads.call_args() + ["part", "numel"] + reads.stride_call_args()
        warps, stages = int(params["num_warps"]), int(params["num_stages"])
        f.append(f"_total_partials[(n_parts,)]({', '.join(call)}, BLOCK=BLOCK, num_warps={warps}, "
                 f"num_stages={stages})")
        if not apply:
            f += [f"out = torch.empty({list(out_t.shape)!r}, dtype={torch_dtype(out_t.dtype)}, device=t0.device)",
                  "_total_finish[(1,)](part, out, n_parts, numel, BLOCK_P=triton.next_power_of_2(n_parts))",
                  "return out"]
        else:
            k += self._apply_kernel(fm, scalars, f, params)
        doc = f"{red.op} of the whole tensor ({variant}), rendered by kernelsmith."
        return module_source(fm, doc, "\n".join(k), f, BROADCAST_HELPER + SM_COUNT_HELPER, params)

    def _apply_kernel(self, fm: FamilyMatch, scalars: list[str], f: list[str], params: dict[str, Any]) -> list[str]:
        """The full-shape epilogue's kernel; appends its launch (after the finish's) to the forward lines ``f``."""
        g, a = fm.graph, fm.attrs
        out_t = g.type_of(a["out"])
        nodes = fm.nodes("apply")
        reads = element_reads(fm, chain_leaves(fm, nodes, set(a["apply"]), frozenset(scalars)), out_t.shape)
        env = dict(reads.env)
        for j, n in enumerate(scalars):
            env[n] = Val(f"c{j}")
        lines = lower_or_decline(nodes, env)
        big = out_t.numel >= 2**31 - 1
        sig = reads.kernel_params() + ["sc_ptr", "out_ptr", "numel"] + reads.stride_params()
        k = ["", "", "@triton.jit", f"def _total_apply({', '.join(sig)}, BLOCK: tl.constexpr):",
             f"    offs = tl.program_id(0){'.to(tl.int64)' if big else ''} * BLOCK + tl.arange(0, BLOCK)",
             "    mask = offs < numel"]
        k += [f"    c{j} = tl.load(sc_ptr + {j})" for j in range(len(scalars))]
        k += reads.index_lines("    ") + reads.load_lines("    ")
        k += ["    " + ln for ln in lines]
        k.append(f"    tl.store(out_ptr + offs, {store_expr(env[a['out']].expr, out_t.dtype)}, mask=mask)")
        # The apply kernel's reads replace the first kernel's t{i} and shape: launch the first two kernels first.
        f += ["sc = torch.empty(" + str(max(1, len(scalars))) + ", dtype=torch.float32, device=t0.device)",
              "_total_finish[(1,)](part, sc, n_parts, numel, BLOCK_P=triton.next_power_of_2(n_parts))"]
        f += reads.forward_lines()
        if not reads.names:
            f.append(f"shape = {list(out_t.shape)!r}")
        f += [f"out = torch.empty(shape, dtype={torch_dtype(out_t.dtype)}, device=sc.device)",
              "numel = out.numel()"] + reads.stride_forward_lines()
        call = reads.call_args() + ["sc", "out", "numel"] + reads.stride_call_args()
        f += [f"_total_apply[(triton.cdiv(numel, BLOCK),)]({', '.join(call)}, BLOCK=BLOCK, "
              f"num_warps={int(params['num_warps'])})",
              "return out"]
        return k


register(Family("total", priority=70, match=match, templates=(TotalTemplate(),)))
