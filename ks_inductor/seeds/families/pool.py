"""Max and average pooling over 2 or 3 spatial dims (the 1-d pools arrive as 2-d ones over a size-1 dim).

Two variants:
- ``flat``: each lane computes one output. It splits its flat index into (outer, spatial position), walks the
  window with static loops, and masks the taps that fall in the padding.
- ``window``: a program computes a strip of ``ROWS`` output rows by ``BW`` output columns. The window's taps along
  the last dim are a tensor axis, so one masked load of [BW, taps] fetches a whole row of windows (coalesced even
  where the stride spreads the lanes), reduced along that axis to one value per column: the row's partial result.
  Each input row's partial is computed once and reused by every output row of the strip whose window covers it, so
  a window of k rows at stride 1 reads each input row about once instead of k times.
A max keeps NaN as torch's does (the padding reads -inf, which never wins); an average sums in fp32 and divides as
torch does: by the window's size clipped to the padded input (count_include_pad) or to the input itself, or by
divisor_override. Window, stride, padding, dilation and the spatial sizes are literals of the render: a region's
shapes are fixed by its key.
"""

from __future__ import annotations

from math import prod
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import FLOATS
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    MAX_ELEMS_PER_THREAD,
    Template,
    block_class,
    elems_per_thread,
    module_source,
    next_pow2,
    torch_dtype,
)
from ks_inductor.seeds.graph import Graph, Ref
from ks_inductor.seeds.pointwise import literal, max_expr, reduce_expr, store_expr

# aten pooling op -> (kind, spatial dims). The 1-d pools reach aten as 2-d ones over an unsqueezed input.
POOLS = {"max_pool2d_with_indices": ("max", 2), "max_pool3d_with_indices": ("max", 3),
         "avg_pool2d": ("avg", 2), "avg_pool3d": ("avg", 3)}
_POOL_VIEWS = frozenset({"unsqueeze", "squeeze", "getitem", "alias"})


def _per_dim(v: Any, nd: int, default: int) -> list[int] | None:
    """A pooling argument (an int, a list of one, or one per dim; empty means ``default``) as one int per dim."""
    if v is None or v == []:
        return [default] * nd
    if isinstance(v, int):
        return [v] * nd
    if isinstance(v, list) and all(isinstance(x, int) for x in v) and len(v) in (1, nd):
        return list(v) * (nd // len(v))
    return None


def match(graph: Graph) -> dict[str, Any] | None:
    """One max or average pool of a float input, seen through the views that add or drop size-1 dims (how the
    1-d pools reach aten); for a max pool only its values may be used, not the indices."""
    comp = graph.compute_nodes()
    if len(comp) != 1 or comp[0].op not in POOLS or len(graph.placeholders) != 1 or len(graph.outputs) != 1:
        return None
    n = comp[0]
    kind, nd = POOLS[n.op]
    if any(v.op not in _POOL_VIEWS for v in graph.nodes if v is not n):
        return None
    x_t, out_ref = graph.placeholders[0][1], graph.outputs[0]
    in_t = graph.type_of(n.args[0].name) if isinstance(n.args[0], Ref) else None
    out_t = graph.type_of(out_ref.name) if isinstance(out_ref, Ref) else None
    if x_t is None or in_t is None or out_t is None or x_t.dtype not in FLOATS or len(in_t.shape) < nd + 1:
        return None
    if any(v.op == "getitem" and v.refs() == [n.name] and v.args[1] != 0 for v in graph.nodes):
        return None  # the max pool's indices are used
    names = ["kernel_size", "stride", "padding"] + (["dilation", "ceil_mode"] if kind == "max" else
                                                    ["ceil_mode", "count_include_pad", "divisor_override"])
    args = dict(zip(names, n.args[1:]))
    args.update({k: v for k, v in n.kwargs.items() if k in names})
    kernel = _per_dim(args.get("kernel_size"), nd, 1)
    stride = _per_dim(args.get("stride"), nd, 1) if args.get("stride") not in (None, []) else kernel
    padding = _per_dim(args.get("padding", 0), nd, 0)
    dilation = _per_dim(args.get("dilation", 1), nd, 1)
    if kernel is None or stride is None or padding is None or dilation is None:
        return None
    pooled = n.out[0]
    if pooled is None or pooled.numel != out_t.numel or x_t.numel != in_t.numel:
        return None
    return {"kind": kind, "nd": nd, "x": graph.placeholders[0][0], "kernel": kernel, "stride": stride,
            "padding": padding, "dilation": dilation, "in_spatial": in_t.shape[-nd:],
            "out_spatial": pooled.shape[-nd:], "out_shape": out_t.shape, "dtype": x_t.dtype,
            "count_include_pad": bool(args.get("count_include_pad", True)),
            "divisor_override": args.get("divisor_override")}


MAX_WINDOW_LOADS = 256  # static loads in one window program: beyond this the unrolled kernel compiles slowly


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


def _divisor(a: dict[str, Any], pos: list[str] | None = None, dims: list[int] | None = None,
             name: str = "div") -> list[str]:
    """torch's divide factor: the window clipped to the padded input, or to the input where padding is not
    counted; divisor_override wins over both. ``pos``: each spatial dim's output position (``o{d}`` by default);
    ``dims``: the dims whose factors enter ``name`` (all by default), so a caller can split it into parts."""
    if a["divisor_override"]:
        return [f"    {name} = {literal(float(a['divisor_override']))}"] if dims is None else []
    pos = pos or [f"o{d}" for d in range(a["nd"])]
    lines, sizes = [], []
    for d in range(a["nd"]) if dims is None else dims:
        s0, n, p, kk = a["stride"][d], a["in_spatial"][d], a["padding"][d], a["kernel"][d]
        lines += [f"    lo{d} = {pos[d]} * {s0} - {p}",
                  f"    hi{d} = tl.minimum(lo{d} + {kk}, {n + p})"]
        if not a["count_include_pad"]:
            lines += [f"    hi{d} = tl.minimum(hi{d}, {n})", f"    lo{d} = tl.maximum(lo{d}, 0)"]
        sizes.append(f"(hi{d} - lo{d})")
    return lines + [f"    {name} = ({' * '.join(sizes) or '1'}).to(tl.float32)"]


def _window_rows(a: dict[str, Any], rows: int) -> list[list[int]]:
    """For each output row of a strip, the input rows (relative to the strip's first window) its window covers."""
    h = a["nd"] - 2
    return [[j * a["stride"][h] + k * a["dilation"][h] for k in range(a["kernel"][h])] for j in range(rows)]


def _window_kernel(a: dict[str, Any], bw: int, rows: int) -> str:
    nd, kind = a["nd"], a["kind"]
    ins, outs = a["in_spatial"], a["out_spatial"]
    ks, st, pad, dil = a["kernel"], a["stride"], a["padding"], a["dilation"]
    w, h = nd - 1, nd - 2
    ncb, nstrip = -(-outs[w] // bw), -(-outs[h] // rows)
    kpw = next_pow2(ks[w])
    other = "-float('inf')" if kind == "max" else "0.0"
    plane_in, plane_out = prod(ins), prod(outs)
    # Offsets inside one (outer) plane stay 32-bit where they fit; the plane's base is always 64-bit.
    idx = "tl.int64" if plane_in >= 2**31 - kpw * bw else "tl.int32"
    k = ["@triton.jit",
         "def _pool_window(x_ptr, out_ptr, BW: tl.constexpr, KPW: tl.constexpr):",
         f"    pid = tl.program_id(0).to({idx})",
         f"    cb = pid % {ncb}",
         f"    t = pid // {ncb}",
         f"    sb = t % {nstrip}",
         f"    t = t // {nstrip}"]
    if nd == 3:
        k += [f"    od = t % {outs[0]}", f"    t = t // {outs[0]}"]
    k += [f"    base = x_ptr + t.to(tl.int64) * {plane_in}",
          f"    obase = out_ptr + t.to(tl.int64) * {plane_out}" + (f" + od * {outs[1] * outs[2]}" if nd == 3 else ""),
          f"    ow = cb * BW + tl.arange(0, BW).to({idx})",
          f"    wmask = ow < {outs[w]}",
          "    kw = tl.arange(0, KPW)",
          f"    cols = ow[:, None] * {st[w]} - {pad[w]} + kw[None, :] * {dil[w]}",
          f"    cmask = wmask[:, None] & (kw[None, :] < {ks[w]}) & (cols >= 0) & (cols < {ins[w]})",
          # Row and depth conditions are scalars, but the interpreter rejects a mask of a tensor and a scalar
          # condition; compared as broadcast zeros they cost the compiled kernel nothing.
          f"    zc = tl.zeros([1, KPW], {idx})",
          f"    zw = tl.zeros([BW], {idx})",
          f"    oh0 = sb * {rows}",
          f"    row0 = oh0 * {st[h]} - {pad[h]}"]
    if nd == 3:
        for kd in range(ks[0]):
            k += [f"    d{kd} = od * {st[0]} - {pad[0]} + {kd * dil[0]}",
                  f"    dm{kd} = (zc + d{kd} >= 0) & (zc + d{kd} < {ins[0]})"]
    if kind == "avg":
        k += _divisor(a, pos=["od", "oh", "ow"][-nd:], dims=[w] + ([0] if nd == 3 else []), name="divw")

    def combine(acc: str, v: str) -> str:
        return max_expr(acc, v) if kind == "max" else f"{acc} + {v}"

    def reduce_taps(v: str) -> str:
        return reduce_expr("amax", v, 1) if kind == "max" else f"tl.sum({v}, 1)"

    done: set[int] = set()
    for j, needed in enumerate(_window_rows(a, rows)):
        for r in needed:
            if r in done:
                continue
            done.add(r)
            k += [f"    i{r} = row0 + {r}", f"    im{r} = (zc + i{r} >= 0) & (zc + i{r} < {ins[h]})"]
            taps = [(f" + d{kd} * {ins[1] * ins[2]}", f" & dm{kd}") for kd in range(ks[0])] if nd == 3 \
                else [("", "")]
            # The depth taps combine elementwise; one reduction along the window's columns then ends the row.
            for n, (doff, dmask) in enumerate(taps):
                k.append(f"    v = tl.load(base + i{r} * {ins[w]}{doff} + cols, mask=cmask & im{r}{dmask}, "
                         f"other={other}).to(tl.float32)")
                k.append("    t2 = v" if n == 0 else f"    t2 = {combine('t2', 'v')}")
            k.append(f"    h{r} = {reduce_taps('t2')}")
        acc = f"h{needed[0]}"
        for r in needed[1:]:
            acc = combine(acc, f"h{r}")
        k.append(f"    oh = oh0 + {j}")
        res = "acc"
        k.append(f"    acc = {acc}")
        if kind == "avg":
            k += _divisor(a, pos=["od", "oh", "ow"][-nd:], dims=[h], name="divh")
            res = "acc / (divh * divw)" if not a["divisor_override"] else f"acc / {literal(float(a['divisor_override']))}"
        k.append(f"    tl.store(obase + oh * {outs[w]} + ow, {store_expr(res, a['dtype'])}, "
                 f"mask=wmask & (zw + oh < {outs[h]}))")
    return "\n".join(k)


class PoolTemplate(Template):
    name = "pool"
    families = ("pool",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["flat", "window"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        if variant == "window":
            a = fm.attrs
            oh = a["out_spatial"][a["nd"] - 2]
            return {"BW": [16, 32, 64, 128, 256, 512], "ROWS": [r for r in (1, 2, 4, 8, 16, 32) if r < 2 * oh],
                    "num_warps": [1, 2, 4, 8], "num_stages": [1]}
        return {"BLOCK": [128, 256, 512, 1024, 2048], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2]}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        if variant == "window":
            a = fm.attrs
            nd = a["nd"]
            kpw = next_pow2(a["kernel"][nd - 1])
            h = nd - 2
            overlap = (a["kernel"][h] - 1) * a["dilation"][h] + 1 > a["stride"][h]
            if device == "cpu":
                # The interpreter pays per program, not per lane: the fewest programs the space allows.
                bw, rows = min(512, next_pow2(a["out_spatial"][nd - 1])), 32
            else:
                bw, rows = min(256, next_pow2(a["out_spatial"][nd - 1]), 2048 // kpw), 16 if overlap else 1
            bw = max(16, bw)
            rows = min(rows, next_pow2(a["out_spatial"][h]))
            while rows > 1 and not self.feasible(fm, {"BW": bw, "ROWS": rows, "num_warps": 4}, variant):
                rows //= 2
            return {"BW": bw, "ROWS": rows, "num_warps": 4, "num_stages": 1}
        return {"BLOCK": 512, "num_warps": 4, "num_stages": 1}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        if variant == "window":
            a = fm.attrs
            kpw = next_pow2(a["kernel"][a["nd"] - 1])
            # Every input row of the strip is a static load (per depth tap): bound the unrolled body.
            loads = len({r for rs in _window_rows(a, params["ROWS"]) for r in rs})
            loads *= a["kernel"][0] if a["nd"] == 3 else 1
            return (elems_per_thread(params["BW"] * kpw, params["num_warps"]) <= MAX_ELEMS_PER_THREAD
                    and loads <= MAX_WINDOW_LOADS)
        return elems_per_thread(params["BLOCK"], params["num_warps"]) <= MAX_ELEMS_PER_THREAD

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK"] if variant == "flat" else params["BW"] * params["ROWS"])
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        if variant == "window":
            return self._render_window(fm, params)
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

    def _render_window(self, fm: FamilyMatch, params: dict[str, Any]) -> str:
        a = fm.attrs
        nd = a["nd"]
        bw, rows = int(params["BW"]), int(params["ROWS"])
        outs = a["out_spatial"]
        outer = prod(a["out_shape"]) // prod(outs)  # a 1-d pool's output has no size-1 dim
        grid = outer * (outs[0] if nd == 3 else 1) * -(-outs[nd - 2] // rows) * -(-outs[nd - 1] // bw)
        body = [
            f"x = {fm.operand(a['x'])}.contiguous()",
            f"out = torch.empty({list(a['out_shape'])!r}, dtype={torch_dtype(a['dtype'])}, device=x.device)",
            f"_pool_window[({grid},)](x, out, BW={bw}, KPW={next_pow2(a['kernel'][nd - 1])}, "
            f"num_warps={int(params['num_warps'])}, num_stages={int(params['num_stages'])})",
            "return out",
        ]
        what = f"{a['kind']} pool over {nd} dims, window {a['kernel']}"
        return module_source(fm, f"{what} (window: {rows} output rows by {bw} columns a program), rendered by "
                             "kernelsmith.", _window_kernel(a, bw, rows), body)


register(Family("pool", priority=90, match=match, templates=(PoolTemplate(),)))
