"""Cumulative sums and products over one dim (forwards, backwards, exclusive), with the pointwise work before and
after them: a program carries each line's running total from one block of the line to the next.

The input is seen as (outer, R, inner). The "row" variant scans contiguous rows (inner == 1), ROWS rows per
program; the "col" variant scans along a strided dim, BLOCK_I neighbouring lines per program so that its loads
are contiguous. A backwards scan walks positions R - 1 - c; an exclusive one reads position c - 1 at position c,
with the first position reading the identity. Each block is scanned with ``tl.cumsum``/``tl.cumprod`` in fp32 and
the carry is the block's last scanned value, so the running total is the reference's up to the order of the adds.
"""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import SCANS, FamilyMatch
from ks_inductor.evolve.graph import Node, Ref
from ks_inductor.evolve.pointwise import Val, literal, round_expr, store_expr
from ks_inductor.evolve.templates.base import (
    MAX_ELEMS_PER_THREAD,
    Template,
    TemplateError,
    block_class,
    elems_per_thread,
    inner_size,
    lower_or_decline,
    module_source,
    rounding_default,
    rounding_space,
    torch_dtype,
)
from ks_inductor.evolve.templates.elements import BROADCAST_HELPER, chain_leaves, element_reads

# Per variant: the kernel's signature and prologue up to the block loop; the tile's position along R (c), its
# mask (m), the address of position p, the scan axis, the carry's broadcast and the last position of a block.
_VARIANTS = {
    "row": {
        "head": ["    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)",
                 "    rmask = rows < n_rows",
                 "    lanes = tl.arange(0, BLOCK_R)[None, :]",
                 "    base = rows.to(tl.int64)[:, None] * R",
                 "    carry = tl.full([ROWS], {ident}, tl.float32)"],
        "consts": "ROWS: tl.constexpr, BLOCK_R: tl.constexpr",
        "args": "n_rows, R",
        "c": "off + lanes", "m": "rmask[:, None] & (c < R)", "addr": "base + {p}", "axis": 1,
        "bcast": "carry[:, None]", "last": "lanes == BLOCK_R - 1",
    },
    "col": {
        "head": ["    o = tl.program_id(1).to(tl.int64)",
                 "    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)",
                 "    imask = i < INNER",
                 "    lanes = tl.arange(0, BLOCK_R)[:, None]",
                 "    base = o * R * INNER + i[None, :]",
                 "    carry = tl.full([BLOCK_I], {ident}, tl.float32)"],
        "consts": "BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr",
        "args": "R, INNER",
        "c": "off + lanes", "m": "(c < R) & imask[None, :]", "addr": "base + ({p}).to(tl.int64) * INNER", "axis": 0,
        "bcast": "carry[None, :]", "last": "lanes == BLOCK_R - 1",
    },
}


def _reader(name: str, op: str = "read") -> Node:
    """A stand-in node that reads ``name``: the scan itself, for the leaf and rounding rules."""
    return Node("_scan", f"aten.{op}.default", [Ref(name)], {}, [])


class ScanTemplate(Template):
    name = "scan"
    families = ("scan",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["row"] if inner_size(fm, fm.attrs["tail"], fm.attrs["dim"]) == 1 else ["col"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        if variant == "row":
            s: dict[str, list[Any]] = {"ROWS": [1, 2, 4, 8], "BLOCK_R": [128, 256, 512, 1024, 2048, 4096]}
        else:
            s = {"BLOCK_R": [4, 8, 16, 32, 64], "BLOCK_I": [16, 32, 64, 128, 256]}
        return {**s, "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3], **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        p = {"ROWS": 1, "BLOCK_R": 1024} if variant == "row" else {"BLOCK_R": 16, "BLOCK_I": 64}
        return {**p, "num_warps": 4, "num_stages": 1, **rounding_default(fm)}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        tile = params["BLOCK_R"] * params.get("ROWS", 1) * params.get("BLOCK_I", 1)
        return elems_per_thread(tile, params["num_warps"]) <= MAX_ELEMS_PER_THREAD // 2

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_R"] * params.get("ROWS", 1) * params.get("BLOCK_I", 1))
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g, a = fm.graph, fm.attrs
        v = _VARIANTS[variant]
        tail_t = g.type_of(a["tail"])
        out_t = g.type_of(a["out"])
        if tail_t is None or out_t is None:
            raise TemplateError("the scan's graph is incomplete")
        pro, epi = fm.nodes("prologue"), fm.nodes("epilogue")
        inside = set(a["prologue"]) | set(a["epilogue"])
        # the scanned value: computed by the prologue or read as it is
        leaves = chain_leaves(fm, pro + epi + [_reader(a["head"])], inside, frozenset({a["tail"]}))
        reads = element_reads(fm, leaves, tail_t.shape)
        if not reads.names or reads.strided:
            raise TemplateError("every input of a scan must have the scanned shape and a contiguous layout")
        if a["exclusive"] and epi and any(r in a["prologue"] or r == a["head"] for n in epi for r in n.refs()):
            raise TemplateError("an exclusive scan's epilogue reads its inputs only")
        env = dict(reads.env)
        pro_lines = lower_or_decline(pro, env, [_reader(a["head"], a["op"])])
        x = env[a["head"]]
        if x.kind != "f":
            raise TemplateError("the scanned value is not a float")
        ident = literal(SCANS[a["op"]])
        fn = "tl.cumsum" if a["op"] == "cumsum" else "tl.cumprod"
        join = "+" if a["op"] == "cumsum" else "*"
        pos = "R - 1 - c" if a["reverse"] else "c"
        ind = "        "
        k = ["@triton.jit",
             f"def _scan({', '.join(reads.kernel_params())}, out_ptr, {v['args']}, {v['consts']}):"]
        k += [ln.format(ident=ident) for ln in v["head"]]
        k += ["    for off in range(0, R, BLOCK_R):",
              ind + f"c = {v['c']}",
              ind + f"m = {v['m']}",
              ind + f"p = {pos}"]
        if a["exclusive"]:
            k += [ind + "mask = m & (p > 0)", ind + f"offs = {v['addr'].format(p='p - 1')}"]
        else:
            k += [ind + "mask = m", ind + f"offs = {v['addr'].format(p='p')}"]
        k += reads.load_lines(ind) + [ind + ln for ln in pro_lines]
        # masked lanes, and an exclusive scan's first position, add the identity
        k += [ind + f"x = tl.where(mask, {x.expr}, {ident})",
              ind + f"s = {fn}(x, axis={v['axis']}) {join} {v['bcast']}",
              ind + f"carry = tl.sum(tl.where({v['last']}, s, 0.0), axis={v['axis']})",
              ind + f"x_scan = {round_expr('s', tail_t.dtype)}"]
        if a["exclusive"] and epi:
            k += [ind + "mask = m", ind + f"offs = {v['addr'].format(p='p')}"] + reads.load_lines(ind)
        env[a["tail"]] = Val("x_scan")
        k += [ind + ln for ln in lower_or_decline(epi, env)]
        k.append(ind + f"tl.store(out_ptr + {v['addr'].format(p='p')}, "
                 f"{store_expr(env[a['out']].expr, out_t.dtype)}, mask=m)")

        warps, stages = int(params["num_warps"]), int(params["num_stages"])
        f = reads.forward_lines() + [
            f"dim = {a['dim']}",
            "outer = 1",
            "for s_ in shape[:dim]:",
            "    outer *= s_",
            "inner = 1",
            "for s_ in shape[dim + 1:]:",
            "    inner *= s_",
            "R = shape[dim]",
            f"out = torch.empty(shape, dtype={torch_dtype(out_t.dtype)}, device=t0.device)",
        ]
        call = ", ".join(reads.call_args())
        if variant == "row":
            rows = int(params["ROWS"])
            f.append(f"_scan[(triton.cdiv(outer, {rows}),)]({call}, out, outer, R, ROWS={rows}, "
                     f"BLOCK_R={int(params['BLOCK_R'])}, num_warps={warps}, num_stages={stages})")
        else:
            bi = int(params["BLOCK_I"])
            f.append(f"_scan[(triton.cdiv(inner, {bi}), outer)]({call}, out, R, inner, "
                     f"BLOCK_R={int(params['BLOCK_R'])}, BLOCK_I={bi}, num_warps={warps}, num_stages={stages})")
        f.append("return out")
        kind = ("exclusive " if a["exclusive"] else "") + ("reverse " if a["reverse"] else "") + a["op"]
        return module_source(fm, f"{kind} over dim {a['dim']} ({variant}), rendered by kernelsmith.", "\n".join(k), f,
                             BROADCAST_HELPER, params)
