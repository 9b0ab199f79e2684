"""Max and average pooling over 2 or 3 spatial dims (the 1-d pools arrive as 2-d ones over a size-1 dim).

Each lane computes one output: it splits its flat index into (outer, spatial position), walks the window with
static loops, and masks the taps that fall in the padding. A max keeps NaN as torch's does (the padding reads
-inf, which never wins); an average sums in fp32 and divides as torch does: by the window's size clipped to the
padded input (count_include_pad) or to the input itself, or by divisor_override. Window, stride, padding,
dilation and the spatial sizes are literals of the render: a region's shapes are fixed by its key.
"""

from __future__ import annotations

from math import prod
from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.pointwise import literal, max_expr, store_expr
from ks_inductor.evolve.templates.base import (
    MAX_ELEMS_PER_THREAD,
    Template,
    block_class,
    elems_per_thread,
    module_source,
    torch_dtype,
)


def _kernel(a: dict[str, Any], numel: int, block: int) -> str:
    nd, kind = a["nd"], a["kind"]
    ins, outs = a["in_spatial"], a["out_spatial"]
    ks, st, pad, dil = a["kernel"], a["stride"], a["padding"], a["dilation"]
    # 32-bit index arithmetic where every offset fits, the last block's lanes past the end included: 64-bit
    # division costs several times as much on a GPU.
    idx = "tl.int64" if numel + block >= 2**31 else "tl.int32"
    k = ["@triton.jit",
         "def _pool(x_ptr, out_ptr, n_out, BLOCK: tl.constexpr):",
         f"    offs = tl.program_id(0).to({idx}) * BLOCK + tl.arange(0, BLOCK).to({idx})",
         "    mask = offs < n_out",
         "    r = offs"]
    for d in reversed(range(nd)):
        k += [f"    o{d} = r % {outs[d]}", f"    r = r // {outs[d]}"]
    k.append(f"    base = x_ptr + r * {prod(ins)}")
    other = "-float('inf')" if kind == "max" else "0.0"
    k.append(f"    acc = tl.full([BLOCK], {other}, tl.float32)")
    ind = "    "
    for d in range(nd):
        k += [f"{ind}for k{d} in tl.static_range({ks[d]}):",
              f"{ind}    i{d} = o{d} * {st[d]} - {pad[d]} + k{d} * {dil[d]}",
              f"{ind}    m{d} = {'mask' if d == 0 else f'm{d - 1}'} & (i{d} >= 0) & (i{d} < {ins[d]})"]
        ind += "    "
    addr = " + ".join(f"i{d} * {prod(ins[d + 1:])}" if d < nd - 1 else f"i{d}" for d in range(nd))
    k.append(f"{ind}v = tl.load(base + {addr}, mask=m{nd - 1}, other={other}).to(tl.float32)")
    k.append(f"{ind}acc = {max_expr('acc', 'v') if kind == 'max' else 'acc + v'}")
    if kind == "avg":
        k += _divisor(a)
        res = "acc / div"
    else:
        res = "acc"
    k.append(f"    tl.store(out_ptr + offs, {store_expr(res, a['dtype'])}, mask=mask)")
    return "\n".join(k)


def _divisor(a: dict[str, Any]) -> list[str]:
    """torch's divide factor: the window clipped to the padded input, or to the input where padding is not
    counted; divisor_override wins over both."""
    if a["divisor_override"]:
        return [f"    div = {literal(float(a['divisor_override']))}"]
    lines, sizes = [], []
    for d in range(a["nd"]):
        s0, n, p, kk = a["stride"][d], a["in_spatial"][d], a["padding"][d], a["kernel"][d]
        lines += [f"    lo{d} = o{d} * {s0} - {p}",
                  f"    hi{d} = tl.minimum(lo{d} + {kk}, {n + p})"]
        if not a["count_include_pad"]:
            lines += [f"    hi{d} = tl.minimum(hi{d}, {n})", f"    lo{d} = tl.maximum(lo{d}, 0)"]
        sizes.append(f"(hi{d} - lo{d})")
    return lines + [f"    div = ({' * '.join(sizes)}).to(tl.float32)"]


class PoolTemplate(Template):
    name = "pool"
    families = ("pool",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["flat"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        return {"BLOCK": [128, 256, 512, 1024, 2048], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2]}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        return {"BLOCK": 512, "num_warps": 4, "num_stages": 1}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        return elems_per_thread(params["BLOCK"], params["num_warps"]) <= MAX_ELEMS_PER_THREAD

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK"])
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        a = fm.attrs
        x_t = fm.graph.type_of(a["x"])
        numel = max(x_t.numel if x_t is not None else 0, prod(a["out_shape"]))
        block = int(params["BLOCK"])
        body = [
            f"x = {fm.operand(a['x'])}.contiguous()",
            f"out = torch.empty({list(a['out_shape'])!r}, dtype={torch_dtype(a['dtype'])}, device=x.device)",
            "n_out = out.numel()",
            f"_pool[(triton.cdiv(n_out, {block}),)](x, out, n_out, BLOCK={block}, "
            f"num_warps={int(params['num_warps'])}, num_stages={int(params['num_stages'])})",
            "return out",
        ]
        what = f"{a['kind']} pool over {a['nd']} dims, window {a['kernel']}"
        return module_source(fm, f"{what} ({variant}), rendered by kernelsmith.", _kernel(a, numel, block), body)
