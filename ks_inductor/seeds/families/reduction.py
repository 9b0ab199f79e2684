"""Sum / mean / amax / amin / argmax / argmin over one dim. The input is seen as (outer, R, inner): a row reduction
(inner == 1) reduces ROWS rows per program along contiguous memory; a column reduction tiles the inner dim and walks
R.

argmax and argmin follow torch: the first index of the extreme value, and NaN counts as the extreme (the first NaN
wins). Each lane of the tile keeps its best value and index as it walks R (a later index only wins when strictly
better), and the lanes then agree on the best value and, among the lanes holding it, the smallest index."""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import Template, block_class, inner_size, module_source, torch_dtype
from ks_inductor.seeds.graph import VIEW_OPS, Graph, Node, Ref
from ks_inductor.seeds.pointwise import max_expr, min_expr, reduce_expr


def _values_only(graph: Graph, n: Node) -> str | None:
    """For max.dim / min.dim: the dtype of the values, where the graph returns only them (``torch.max(x, d)[0]``)."""
    uses = [u for u in graph.nodes if any(isinstance(x, Ref) and x.name == n.name for x in u.args)]
    outs = [o.name for o in graph.outputs if isinstance(o, Ref)]
    if len(uses) != 1 or uses[0].op != "getitem" or uses[0].args[1] != 0 or outs != [uses[0].name]:
        return None
    t = graph.type_of(uses[0].name)
    return t.dtype if t is not None else None


def match(graph: Graph) -> dict[str, Any] | None:
    """One sum, mean, amax, amin, argmax or argmin of a placeholder over one dim (also the values of max.dim and
    min.dim, where the indices are unused)."""
    comp = graph.compute_nodes()
    if len(comp) != 1 or comp[0].op not in ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin"):
        return None
    n = comp[0]
    src = n.args[0]
    if not isinstance(src, Ref) or not src.name.startswith("p"):
        return None
    t = graph.type_of(src.name)
    dims = n.args[1] if len(n.args) > 1 else None
    op = n.op
    out_dtype = n.type.dtype if n.type else "float32"
    if op in ("max", "min"):  # max.dim / min.dim: values and indices; only the values may be used
        vdt = _values_only(graph, n) if isinstance(dims, int) else None
        if vdt is None:
            return None
        op, dims, out_dtype = "a" + op, [dims], vdt
    elif op in ("argmax", "argmin"):  # over one dim only; over the flattened tensor (dim=None) is another shape
        if not isinstance(dims, int):
            return None
        dims = [dims]
    if t is None or not isinstance(dims, list) or len(dims) != 1 or not t.shape:
        return None
    dim = dims[0] % len(t.shape)
    keep = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    if not all(v.op in ("getitem", "alias") for v in graph.nodes if v.op in VIEW_OPS):
        return None
    return {"op": op, "x": src.name, "dim": dim, "keepdim": keep, "out_dtype": out_dtype}


_NEUTRAL = {"sum": "0.0", "mean": "0.0", "amax": "-float('inf')", "amin": "float('inf')",
            "argmax": "-float('inf')", "argmin": "float('inf')"}
_STEP = {"sum": "acc + v", "mean": "acc + v", "amax": max_expr("acc", "v"), "amin": min_expr("acc", "v")}
_ARG_BETTER = {"argmax": ">", "argmin": "<"}
_ARG_PICK = {"argmax": "tl.max", "argmin": "tl.min"}

# One skeleton per variant: the tile's addressing and masks. TILE is the accumulator's shape, IDX the index along
# R of each element of the tile, AX the axis along R; {init}, {step} and {finish} are the op's (below).
_ROW_KERNEL = """
@triton.jit
def _reduce_rows(x_ptr, out_ptr, n_rows, R, ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_R)
    base = x_ptr + rows.to(tl.int64)[:, None] * R
{init}
    for off in range(0, R, BLOCK_R):
        c = off + cols
        m = rmask[:, None] & (c[None, :] < R)
        v = tl.load(base + c[None, :], mask=m, other={neutral}).to(tl.float32)
{step}
{finish}
    tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=rmask)
"""
_COL_KERNEL = """
@triton.jit
def _reduce_cols(x_ptr, out_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = i < INNER
    r = tl.arange(0, BLOCK_R)
    base = x_ptr + o * R * INNER
{init}
    for off in range(0, R, BLOCK_R):
        rr = off + r
        m = (rr[:, None] < R) & imask[None, :]
        v = tl.load(base + rr.to(tl.int64)[:, None] * INNER + i[None, :], mask=m, other={neutral}).to(tl.float32)
{step}
{finish}
    tl.store(out_ptr + o * INNER + i, res.to(out_ptr.dtype.element_ty), mask=imask)
"""
_TILE = {"row": ("[ROWS, BLOCK_R]", "cols[None, :]", "c[None, :]", 1, ":, None"),
         "col": ("[BLOCK_R, BLOCK_I]", "r[:, None]", "rr[:, None]", 0, "None, :")}


def _kernel(op: str, variant: str) -> str:
    tile, first_idx, idx, ax, bcast = _TILE[variant]
    n = _NEUTRAL[op]
    if op not in _ARG_BETTER:
        init = f"    acc = tl.full({tile}, {n}, tl.float32)"
        step = f"        acc = {_STEP[op]}"
        combined = f"tl.sum(acc, axis={ax})" if op in ("sum", "mean") else reduce_expr(op, "acc", ax)
        finish = f"    res = {combined}" + (" / R" if op == "mean" else "")
    else:
        # Each lane keeps its best value and index (a later index wins only when strictly better, or NaN over a
        # number); then the lanes agree on the best value and, among those holding it, the smallest index.
        init = (f"    best = tl.full({tile}, {n}, tl.float32)\n"
                f"    best_i = tl.zeros({tile}, tl.int64) + {first_idx}")
        step = (f"        take = m & ((v {_ARG_BETTER[op]} best) | ((v != v) & (best == best)))\n"
                "        best = tl.where(take, v, best)\n"
                f"        best_i = tl.where(take, {idx}.to(tl.int64), best_i)")
        finish = ("    is_nan = best != best\n"
                  f"    any_nan = tl.max(is_nan.to(tl.int32), axis={ax}) > 0\n"
                  f"    top = {_ARG_PICK[op]}(tl.where(is_nan, {n}, best), axis={ax})\n"
                  f"    holds = tl.where(any_nan[{bcast}], is_nan, best == top[{bcast}])\n"
                  f"    res = tl.min(tl.where(holds, best_i, R), axis={ax})")
    skeleton = _ROW_KERNEL if variant == "row" else _COL_KERNEL
    return skeleton.format(init=init, step=step, finish=finish, neutral=n)


class ReductionTemplate(Template):
    name = "reduction"
    families = ("reduction",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["row"] if inner_size(fm, fm.attrs["x"], fm.attrs["dim"]) == 1 else ["col"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        if variant == "row":
            return {"ROWS": [1, 2, 4, 8, 16], "BLOCK_R": [128, 256, 512, 1024, 2048, 4096],
                    "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3]}
        return {"BLOCK_R": [4, 8, 16, 32, 64], "BLOCK_I": [32, 64, 128, 256, 512],
                "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        if variant == "row":
            return {"ROWS": 1, "BLOCK_R": 1024, "num_warps": 4, "num_stages": 1}
        return {"BLOCK_R": 16, "BLOCK_I": 128, "num_warps": 4, "num_stages": 1}

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_R"] * params.get("ROWS", 1) * params.get("BLOCK_I", 1))
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        kernel = _kernel(fm.attrs["op"], variant)
        if variant == "row":
            launch = (f"_reduce_rows[(triton.cdiv(outer, {int(params['ROWS'])}),)](x3, out, outer, R, "
                      f"ROWS={int(params['ROWS'])}, BLOCK_R={int(params['BLOCK_R'])}, ")
        else:
            launch = (f"_reduce_cols[(triton.cdiv(inner, {int(params['BLOCK_I'])}), outer)](x3, out, R, inner, "
                      f"BLOCK_R={int(params['BLOCK_R'])}, BLOCK_I={int(params['BLOCK_I'])}, ")
        return self._module(fm, params, variant, kernel, launch)

    def _module(self, fm: FamilyMatch, params: dict[str, Any], variant: str, kernel: str, launch: str) -> str:
        a = fm.attrs
        op = a["op"]
        dim = a["dim"]
        out_dt = torch_dtype(a["out_dtype"])
        body = [
            f"x = {fm.operand(a['x'])}.contiguous()",
            f"dim = {dim}",
            "outer = 1",
            "for s in x.shape[:dim]:",
            "    outer *= s",
            "inner = 1",
            "for s in x.shape[dim + 1:]:",
            "    inner *= s",
            "R = x.shape[dim]",
            "x3 = x.view(outer, R, inner)",
            f"out_shape = list(x.shape[:dim]) + ([1] if {a['keepdim']} else []) + list(x.shape[dim + 1:])",
            f"out = torch.empty(out_shape, dtype={out_dt}, device=x.device)",
            launch + f"num_warps={int(params['num_warps'])}, num_stages={int(params['num_stages'])})",
            "return out",
        ]
        return module_source(fm, f"{op} over dim {dim} ({variant}), rendered by kernelsmith.", kernel, body)


# Before the whole-tensor reductions (70): a sum of a 1-D tensor over its one dim is both.
register(Family("reduction", priority=60, match=match, templates=(ReductionTemplate(),)))
