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

from ks_inductor.seeds.families.elements import BROADCAST_HELPER, chain_leaves, element_reads
from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import FLOATS, downstream, in_order, upstream, views_are_leaves
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
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
from ks_inductor.seeds.graph import VIEW_OPS, Graph, Node, Ref
from ks_inductor.seeds.pointwise import Val, is_pointwise, literal, round_expr, store_expr

SCANS = {"cumsum": 0.0, "cumprod": 1.0}


def _sole_user(graph: Graph, name: str) -> Node | None:
    users = [n for n in graph.nodes if name in n.refs()]
    return users[0] if len(users) == 1 else None


def _exclusive_head(graph: Graph, scan: Node, dim: int) -> tuple[str, set[str]] | None:
    """``cat([identity, scan(x[..., :-1])], dim)``, the way torch code writes an exclusive scan: x's name and the
    nodes of the pattern, or None. The identity part (zeros for a sum, ones for a product) is one wide along dim."""
    sl = graph.node(scan.args[0].name) if isinstance(scan.args[0], Ref) else None
    cat = _sole_user(graph, scan.name)
    if sl is None or sl.op != "slice" or cat is None or cat.op != "cat" or not isinstance(sl.args[0], Ref):
        return None
    xt = graph.type_of(sl.args[0].name)
    if xt is None:
        return None
    n = xt.shape[dim]
    s_dim, start, end = (list(sl.args[1:4]) + [None, None, None])[:3]
    step = sl.args[4] if len(sl.args) > 4 else 1
    if s_dim is None or s_dim % len(xt.shape) != dim or start not in (0, None) or step != 1 \
            or end not in (n - 1, -1):
        return None
    parts, cdim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
    if not isinstance(parts, list) or len(parts) != 2 or cdim % len(xt.shape) != dim or parts[1] != Ref(scan.name):
        return None
    ident = graph.node(parts[0].name) if isinstance(parts[0], Ref) else None
    it = ident.type if ident is not None else None
    if ident is None or it is None or ident.op not in ("full", "full_like") or it.shape[dim] != 1:
        return None
    value = ident.args[1] if len(ident.args) > 1 else None
    if value != SCANS[scan.op]:
        return None
    return sl.args[0].name, {sl.name, cat.name, ident.name} | _upstream_views(graph, ident)


def _upstream_views(graph: Graph, node: Node) -> set[str]:
    """The view nodes a node reads (a ``full_like`` only reads a shape)."""
    out: set[str] = set()
    todo = list(node.refs())
    while todo:
        v = graph.node(todo.pop())
        if v is not None and v.op in VIEW_OPS:
            out.add(v.name)
            todo += v.refs()
    return out


def match(graph: Graph) -> dict[str, Any] | None:
    """One cumulative sum or product of a float value over one dim, read forwards, backwards (between two flips
    of that dim) or exclusively (``cat([0, cumsum(x[..., :-1])])``), with pointwise work before and after it."""
    comp = graph.compute_nodes()
    scans = [n for n in comp if n.op in SCANS]
    if len(scans) != 1 or len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref):
        return None
    scan = scans[0]
    src = scan.args[0] if scan.args else None
    st = graph.type_of(src.name) if isinstance(src, Ref) else None
    if st is None or not st.shape or st.dtype not in FLOATS or scan.kwargs.get("dtype") is not None or len(scan.args) < 2 or not isinstance(scan.args[1], int):
        return None
    dim = scan.args[1] % len(st.shape)
    head, tail, covered, reverse, exclusive = src.name, scan.name, {scan.name}, False, False
    first = graph.node(src.name)
    if first is not None and first.op == "flip":
        last = _sole_user(graph, scan.name)
        if last is None or last.op != "flip" or _sole_user(graph, first.name) is not scan:
            return None
        if [d % len(st.shape) for d in first.args[1]] != [dim] or [d % len(st.shape) for d in last.args[1]] != [dim]:
            return None
        head, tail, reverse = first.args[0].name, last.name, True
        covered |= {first.name, last.name}
    elif first is not None and first.op == "slice":
        ex = _exclusive_head(graph, scan, dim)
        if ex is None:
            return None
        head, ex_nodes = ex
        tail = next(n for n in ex_nodes if graph.node(n).op == "cat")
        covered |= ex_nodes
        exclusive = True
    out = graph.outputs[0].name
    hn = graph.node(head)
    prologue = upstream(graph, [head], set()) | ({head} if hn is not None and hn.op not in VIEW_OPS else set())
    epilogue = downstream(comp, tail, covered) - {tail}
    names = {n.name for n in comp}
    if names - covered - prologue - epilogue or not all(is_pointwise(graph.node(n)) for n in prologue | epilogue):
        return None
    if out != tail and out not in epilogue or not views_are_leaves(graph, covered):
        return None
    return {"op": scan.op, "dim": dim, "head": head, "tail": tail, "reverse": reverse, "exclusive": exclusive,
            "prologue": in_order(comp, prologue), "epilogue": in_order(comp, epilogue), "out": out}


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


register(Family("scan", priority=80, match=match, templates=(ScanTemplate(),)))
