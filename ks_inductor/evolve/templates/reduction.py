"""Sum / mean / amax / amin / argmax / argmin over one dim. The input is seen as (outer, R, inner): a row reduction
(inner == 1) reduces ROWS rows per program along contiguous memory; a column reduction tiles the inner dim and walks
R.

argmax and argmin follow torch: the first index of the extreme value, and NaN counts as the extreme (the first NaN
wins). Each lane of the tile keeps its best value and index as it walks R (a later index only wins when strictly
better), and the lanes then agree on the best value and, among the lanes holding it, the smallest index."""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.templates.base import Template, block_class, module_source, torch_dtype

_NEUTRAL = {"sum": "0.0", "mean": "0.0", "amax": "-float('inf')", "amin": "float('inf')"}
_COMBINE = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}
_STEP = {"sum": "acc + v", "mean": "acc + v", "amax": "tl.maximum(acc, v)", "amin": "tl.minimum(acc, v)"}


_ARG_NEUTRAL = {"argmax": "-float('inf')", "argmin": "float('inf')"}
_ARG_BETTER = {"argmax": ">", "argmin": "<"}
_ARG_PICK = {"argmax": "tl.max", "argmin": "tl.min"}


def _arg_rows(op: str) -> str:
    n, better, pick = _ARG_NEUTRAL[op], _ARG_BETTER[op], _ARG_PICK[op]
    return f'''
@triton.jit
def _arg_rows(x_ptr, out_ptr, n_rows, R, ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_R)
    base = x_ptr + rows.to(tl.int64)[:, None] * R
    best = tl.full([ROWS, BLOCK_R], {n}, tl.float32)
    best_i = tl.zeros([ROWS, BLOCK_R], tl.int64) + cols[None, :]
    for off in range(0, R, BLOCK_R):
        c = off + cols
        m = rmask[:, None] & (c[None, :] < R)
        v = tl.load(base + c[None, :], mask=m, other={n}).to(tl.float32)
        take = m & ((v {better} best) | ((v != v) & (best == best)))
        best = tl.where(take, v, best)
        best_i = tl.where(take, c[None, :].to(tl.int64), best_i)
    is_nan = best != best
    any_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    top = {pick}(tl.where(is_nan, {n}, best), axis=1)
    holds = tl.where(any_nan[:, None], is_nan, best == top[:, None])
    res = tl.min(tl.where(holds, best_i, R), axis=1)
    tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=rmask)
'''


def _arg_cols(op: str) -> str:
    n, better, pick = _ARG_NEUTRAL[op], _ARG_BETTER[op], _ARG_PICK[op]
    return f'''
@triton.jit
def _arg_cols(x_ptr, out_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = i < INNER
    r = tl.arange(0, BLOCK_R)
    base = x_ptr + o * R * INNER
    best = tl.full([BLOCK_R, BLOCK_I], {n}, tl.float32)
    best_i = tl.zeros([BLOCK_R, BLOCK_I], tl.int64) + r[:, None]
    for off in range(0, R, BLOCK_R):
        rr = off + r
        m = (rr[:, None] < R) & imask[None, :]
        v = tl.load(base + rr.to(tl.int64)[:, None] * INNER + i[None, :], mask=m, other={n}).to(tl.float32)
        take = m & ((v {better} best) | ((v != v) & (best == best)))
        best = tl.where(take, v, best)
        best_i = tl.where(take, rr[:, None].to(tl.int64), best_i)
    is_nan = best != best
    any_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
    top = {pick}(tl.where(is_nan, {n}, best), axis=0)
    holds = tl.where(any_nan[None, :], is_nan, best == top[None, :])
    res = tl.min(tl.where(holds, best_i, R), axis=0)
    tl.store(out_ptr + o * INNER + i, res.to(out_ptr.dtype.element_ty), mask=imask)
'''


class ReductionTemplate(Template):
    name = "reduction"
    families = ("reduction",)

    def _inner(self, fm: FamilyMatch) -> int:
        t = fm.graph.type_of(fm.attrs["x"])
        inner = 1
        for s in t.shape[fm.attrs["dim"] + 1:]:  # type: ignore[union-attr]
            inner *= s
        return inner

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["row"] if self._inner(fm) == 1 else ["col"]

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
        a = fm.attrs
        op = a["op"]
        if op in _ARG_NEUTRAL:
            rows = variant == "row"
            kernel = _arg_rows(op) if rows else _arg_cols(op)
            launch = (f"_arg_rows[(triton.cdiv(outer, {int(params['ROWS'])}),)](x3, out, outer, R, "
                      f"ROWS={int(params['ROWS'])}, BLOCK_R={int(params['BLOCK_R'])}, " if rows else
                      f"_arg_cols[(triton.cdiv(inner, {int(params['BLOCK_I'])}), outer)](x3, out, R, inner, "
                      f"BLOCK_R={int(params['BLOCK_R'])}, BLOCK_I={int(params['BLOCK_I'])}, ")
            return self._module(fm, params, variant, kernel, launch)
        neutral, comb, step = _NEUTRAL[op], _COMBINE[op], _STEP[op]
        div = " / R" if op == "mean" else ""
        if variant == "row":
            kernel = f'''
@triton.jit
def _reduce_rows(x_ptr, out_ptr, n_rows, R, ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_R)
    acc = tl.full([ROWS, BLOCK_R], {neutral}, tl.float32)
    base = x_ptr + rows.to(tl.int64)[:, None] * R
    for off in range(0, R, BLOCK_R):
        c = off + cols
        m = rmask[:, None] & (c[None, :] < R)
        v = tl.load(base + c[None, :], mask=m, other={neutral}).to(tl.float32)
        acc = {step}
    res = {comb}(acc, axis=1){div}
    tl.store(out_ptr + rows, res.to(out_ptr.dtype.element_ty), mask=rmask)
'''
            launch = (f"_reduce_rows[(triton.cdiv(outer, {int(params['ROWS'])}),)](x3, out, outer, R, "
                      f"ROWS={int(params['ROWS'])}, BLOCK_R={int(params['BLOCK_R'])}, ")
        else:
            kernel = f'''
@triton.jit
def _reduce_cols(x_ptr, out_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = i < INNER
    r = tl.arange(0, BLOCK_R)
    acc = tl.full([BLOCK_R, BLOCK_I], {neutral}, tl.float32)
    base = x_ptr + o * R * INNER
    for off in range(0, R, BLOCK_R):
        rr = off + r
        m = (rr[:, None] < R) & imask[None, :]
        v = tl.load(base + rr.to(tl.int64)[:, None] * INNER + i[None, :], mask=m, other={neutral}).to(tl.float32)
        acc = {step}
    res = {comb}(acc, axis=0){div}
    tl.store(out_ptr + o * INNER + i, res.to(out_ptr.dtype.element_ty), mask=imask)
'''
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
