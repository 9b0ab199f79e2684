"""Normalization of long groups: group norm, layer norm over several trailing dims, instance norm, batch norm in
training mode.

A group here runs to millions of values (a GroupNorm group of 8 channels of 512x512, a LayerNorm over 64x256x256,
a BatchNorm channel over a batch of 64 planes of 512x512), far more than one program holds, and there can be as few
groups as there are rows of a batch, fewer than the GPU has SMs. A group is one contiguous segment, or (batch norm)
one segment per batch entry, strided. Each segment is split into chunks of ``BLOCK * ITERS`` values, and two
kernels run:
- statistics: each program reads one chunk and writes its mean and its sum of squared deviations from that mean
  (a running mean and M2 per lane, the lanes merged with Chan's formula at the end), never the raw sum of squares,
  which cancels where the mean is large against the spread;
- apply: each program merges its group's chunk statistics (all of them, as one vector), then normalizes its chunk
  and applies the affine step: per element of the group (layer norm), per channel (group norm), per group (batch
  norm), or none. The first chunk's program of each group also updates a batch norm's running statistics (with
  the unbiased variance, as torch does) and the first program its batch counter.
The ``finalize`` variant puts a third kernel between them: one program per group merges the chunk statistics once
(and updates the running statistics), so that each apply program reads two numbers before it streams its chunk.
The input is read twice and the output written once. With ``REV`` the apply kernel takes the chunks from the last
back, so that its first reads find what the statistics kernel read last still in the L2. Variance is the biased one,
as torch's norms use.
"""

from __future__ import annotations

from math import prod
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import FLOATS, leaf_of
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
from ks_inductor.seeds.graph import Graph, Node, Ref
from ks_inductor.seeds.pointwise import literal, store_expr

_GROUP_NORM_VIEWS = frozenset({"getitem", "view", "_unsafe_view", "reshape", "alias"})


def match(graph: Graph) -> dict[str, Any] | None:
    """One normalization of groups of a float input, its mean and rstd unused: group norm (``native_group_norm``: a
    group is C/G channels of H*W), layer norm over two or more trailing dims (an affine weight and bias per element
    of the group), or batch norm in training mode (``native_batch_norm``: a group is one channel, N strided segments
    of H*W, with an optional weight and bias per channel and running statistics updated in place). Instance norm is
    the batch norm of the input viewed as [1, N*C, ...]: a group is one (n, c) plane.

    A group is ``segs`` segments of ``seg`` contiguous values, ``seg_stride`` apart; groups start ``group_stride``
    apart."""
    comp = graph.compute_nodes()
    if len(graph.outputs) != 1 or not graph.placeholders:
        return None
    norms = [v for v in comp if v.op in ("native_group_norm", "native_layer_norm", "native_batch_norm")]
    if len(norms) != 1:
        return None
    n = norms[0]
    counter = _batch_counter(graph, [v for v in comp if v is not n])
    if counter is False:
        return None
    if any(v.op not in _GROUP_NORM_VIEWS for v in graph.nodes if v is not n and v.name not in (counter or ())):
        return None
    if any(v.op == "getitem" and v.refs() == [n.name] and v.args[1] != 0 for v in graph.nodes):
        return None  # the mean or rstd is used
    x_ref = n.args[0] if n.args else None
    if not isinstance(x_ref, Ref):
        return None
    leaf = leaf_of(graph, x_ref)  # instance norm reaches its op through a reshape of the input
    if leaf is None or any(v.op not in _GROUP_NORM_VIEWS - {"getitem"} for v in leaf[1]):
        return None
    x_name = leaf[0]
    x_t, out_ref = graph.type_of(x_name), graph.outputs[0]
    out_t = graph.type_of(out_ref.name) if isinstance(out_ref, Ref) else None
    if x_t is None or out_t is None or x_t.dtype not in FLOATS or out_t.numel != x_t.numel or not x_t.numel:
        return None
    src = graph.node(out_ref.name)  # the output is the normalized tensor, through getitem and views
    while src is not None and src is not n and src.refs():
        src = graph.node(src.refs()[0])
    if src is not n:
        return None

    def operand(v: Any) -> str | None | bool:
        """A weight, bias or running statistic: a placeholder's name, None where absent, False for anything else."""
        if v is None:
            return None
        return v.name if isinstance(v, Ref) and any(p == v.name for p, _ in graph.placeholders) else False

    a: dict[str, Any] = {"x": x_name, "dtype": x_t.dtype, "out_shape": out_t.shape, "segs": 1,
                         "running": None, "counter": None}
    if n.op == "native_group_norm" and len(n.args) >= 8:
        _, w, b, batch, chans, hw, groups, eps = n.args[:8]
        if not all(isinstance(v, int) for v in (batch, chans, hw, groups)) or groups < 1 or chans % groups:
            return None
        a.update(rows=batch * groups, length=chans // groups * hw, affine="channel", groups=groups,
                 cpg=chans // groups, hw=hw, w=operand(w), b=operand(b), eps=float(eps))
    elif n.op == "native_layer_norm" and len(n.args) >= 5:
        _, shape, w, b, eps = n.args[:5]
        if not isinstance(shape, list) or len(shape) < 2 or list(x_t.shape[-len(shape):]) != list(shape):
            return None
        length = prod(shape)
        a.update(rows=x_t.numel // length, length=length, affine="element", w=operand(w), b=operand(b),
                 eps=float(eps))
    elif n.op == "native_batch_norm" and len(n.args) >= 8:
        _, w, b, rmean, rvar, training, momentum, eps = n.args[:8]
        in_t = graph.type_of(x_ref.name)
        if training is not True or in_t is None or len(in_t.shape) < 2 or not isinstance(momentum, (int, float)):
            return None
        rm, rv = operand(rmean), operand(rvar)
        if rm is False or rv is False or (rm is None) != (rv is None) or (counter is not None and rm is None):
            return None
        batch, chans = in_t.shape[0], in_t.shape[1]
        seg = in_t.numel // (batch * chans)
        a.update(rows=chans, length=batch * seg, segs=batch, seg=seg, seg_stride=chans * seg, group_stride=seg,
                 affine="group" if (w, b) != (None, None) else "none", w=operand(w), b=operand(b), eps=float(eps),
                 running=(rm, rv, float(momentum)) if rm is not None else None,
                 counter=graph.node(counter[0]).args[0].name if counter else None)
    else:
        return None
    if a["w"] is False or a["b"] is False:
        return None
    if a["segs"] == 1:
        a.update(seg=a["length"], seg_stride=0, group_stride=a["length"])
    return a


def _batch_counter(graph: Graph, others: list[Node]) -> tuple[str, str] | None | bool:
    """A batch norm's ``num_batches_tracked += 1`` (an ``add`` of 1 to a placeholder, copied back into it): the
    names of its two nodes; None where the graph has no other compute; False for anything else."""
    others = [v for v in others if v.op not in _GROUP_NORM_VIEWS]
    if not others:
        return None
    if len(others) != 2:
        return False
    add, copy = others
    if add.op != "add" or copy.op != "copy_" or len(add.args) < 2 or add.args[1] != 1 \
            or not isinstance(add.args[0], Ref) or all(p != add.args[0].name for p, _ in graph.placeholders):
        return False
    if len(copy.args) < 2 or copy.args[0] != add.args[0] or copy.args[1] != Ref(add.name):
        return False
    return add.name, copy.name


def _per_seg(a: dict[str, Any], params: dict[str, Any]) -> int:
    return -(-a["seg"] // (int(params["BLOCK"]) * int(params["ITERS"])))


def _chunks(a: dict[str, Any], params: dict[str, Any]) -> int:
    """Chunks per group."""
    return a["segs"] * _per_seg(a, params)


def _locate(a: dict[str, Any], params: dict[str, Any], reverse: bool = False) -> list[str]:
    """The program's group (``row``), chunk within its segment (``c``) and the offset of its segment (``base``);
    ``reverse``: programs take chunks from the last one back."""
    n_chunks, per_seg = _chunks(a, params), _per_seg(a, params)
    pid = f"{a['rows'] * n_chunks - 1} - tl.program_id(0)" if reverse else "tl.program_id(0)"
    lines = [f"    pid = {pid}", f"    row = pid // {n_chunks}", f"    r = pid % {n_chunks}"]
    if a["segs"] == 1:
        return lines + ["    c = r", f"    base = row.to(tl.int64) * {a['group_stride']}"]
    return lines + [f"    c = r % {per_seg}",
                    f"    base = row.to(tl.int64) * {a['group_stride']} + (r // {per_seg}).to(tl.int64) * "
                    f"{a['seg_stride']}"]


def _merge(a: dict[str, Any], params: dict[str, Any], indent: str) -> list[str]:
    """Lines that merge group ``row``'s chunk statistics (as one vector) into its ``mean``, ``var`` and ``rstd``."""
    n_chunks, per_seg = _chunks(a, params), _per_seg(a, params)
    length, seg, chunk = a["length"], a["seg"], int(params["BLOCK"]) * int(params["ITERS"])
    k_in_seg = "k" if a["segs"] == 1 else f"(k % {per_seg})"
    lines = [
        "k = tl.arange(0, CP)",
        f"km = k < {n_chunks}",
        f"pbase = part_ptr + row * {2 * n_chunks}",
        "means = tl.load(pbase + 2 * k, mask=km, other=0.0)",
        "m2s = tl.load(pbase + 2 * k + 1, mask=km, other=0.0)",
        # Every chunk of a segment holds `chunk` values but the last, which holds what is left.
        f"cnts = tl.where(km, tl.minimum({seg} - {k_in_seg} * {chunk}, {chunk}), 0).to(tl.float32)",
        f"mean = tl.sum(cnts * means, 0) / {literal(float(length))}",
        "dm = tl.where(km, means - mean, 0.0)",
        f"var = (tl.sum(m2s, 0) + tl.sum(cnts * dm * dm, 0)) / {literal(float(length))}",
        f"rstd = 1.0 / tl.sqrt(var + {literal(a['eps'])})",
    ]
    return [indent + ln for ln in lines]


def _running(a: dict[str, Any], once: str | None, first: str) -> list[str]:
    """Lines that update the running statistics (under ``once`` where given) and the counter (under ``first``)."""
    lines: list[str] = []
    if a["running"] is not None:
        momentum, length = literal(a["running"][2]), a["length"]
        unbias = literal(float(length) / max(length - 1, 1))
        body = [
            "rm = tl.load(rm_ptr + row).to(tl.float32)",
            "rv = tl.load(rv_ptr + row).to(tl.float32)",
            f"tl.store(rm_ptr + row, (rm + {momentum} * (mean - rm)).to(rm_ptr.dtype.element_ty))",
            f"tl.store(rv_ptr + row, (rv + {momentum} * (var * {unbias} - rv)).to(rv_ptr.dtype.element_ty))",
        ]
        if once:
            lines += [f"    if {once}:"] + ["        " + ln for ln in body]
        else:
            lines += ["    " + ln for ln in body]
    if a["counter"] is not None:
        lines += [f"    if {first}:", "        tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)"]
    return lines


def _kernels(a: dict[str, Any], params: dict[str, Any], variant: str) -> str:
    seg, block, iters = a["seg"], int(params["BLOCK"]), int(params["ITERS"])
    chunk = block * iters
    stages = int(params["num_stages"])
    # Each lane keeps its own running mean and M2 (Welford) across the chunk's tiles and the lanes are merged once at
    # the end: a reduction across the block per tile would put a barrier between every two tiles' loads. A lane is
    # valid from the chunk's first tile up to some tile and masked after, so after tile `it` every valid lane has
    # seen it + 1 values: one reciprocal per tile serves them all.
    stats = [
        "@triton.jit",
        "def _group_stats(x_ptr, part_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr):",
        *_locate(a, params),
        "    lanes = tl.arange(0, BLOCK)",
        "    mean_l = tl.zeros([BLOCK], tl.float32)",
        "    m2_l = tl.zeros([BLOCK], tl.float32)",
        f"    for it in tl.range(0, ITERS, num_stages={stages}):",
        f"        offs = c * {chunk} + it * BLOCK + lanes",
        f"        m = offs < {seg}",
        "        x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)",
        "        delta = x - mean_l",
        "        mean_l = tl.where(m, mean_l + delta * (1.0 / (it + 1.0)), mean_l)",
        "        m2_l = tl.where(m, m2_l + delta * (x - mean_l), m2_l)",
        # Values each lane saw: the tiles up to its last valid one.
        f"    cnt_l = tl.minimum(tl.maximum(tl.cdiv({seg} - c * {chunk} - lanes, BLOCK), 0), ITERS).to(tl.float32)",
        "    n = tl.sum(cnt_l, 0)",
        "    mean = tl.sum(cnt_l * mean_l, 0) / tl.maximum(n, 1.0)",
        "    dm = tl.where(cnt_l > 0, mean_l - mean, 0.0)",
        "    m2 = tl.sum(m2_l, 0) + tl.sum(cnt_l * dm * dm, 0)",
        "    tl.store(part_ptr + 2 * pid, mean)",
        "    tl.store(part_ptr + 2 * pid + 1, m2)",
    ]
    kernels = ["\n".join(stats)]
    if variant == "finalize":
        # One program per group merges its chunks once; the apply programs then read two numbers, not the vector.
        kernels.append("\n".join([
            "@triton.jit",
            "def _group_final(part_ptr, stat_ptr, rm_ptr, rv_ptr, nbt_ptr, CP: tl.constexpr):",
            "    row = tl.program_id(0)",
            *_merge(a, params, "    "),
            "    tl.store(stat_ptr + 2 * row, mean)",
            "    tl.store(stat_ptr + 2 * row + 1, rstd)",
            *_running(a, None, "row == 0"),
        ]))
        head = ["def _group_apply(x_ptr, stat_ptr, w_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr):",
                *_locate(a, params, reverse=bool(params.get("REV", 0))),
                "    mean = tl.load(stat_ptr + 2 * row)",
                "    rstd = tl.load(stat_ptr + 2 * row + 1)"]
    else:
        head = ["def _group_apply(x_ptr, part_ptr, w_ptr, b_ptr, out_ptr, rm_ptr, rv_ptr, nbt_ptr, BLOCK: tl.constexpr,",
                "                 ITERS: tl.constexpr, CP: tl.constexpr):",
                *_locate(a, params, reverse=bool(params.get("REV", 0))),
                *_merge(a, params, "    "),
                *_running(a, "r == 0", "pid == 0")]
    if a["affine"] == "element":
        windex = "offs"
    elif a["affine"] == "channel":
        windex = f"(row % {a['groups']}) * {a['cpg']} + offs // {a['hw']}"
    apply = ["@triton.jit", *head]
    if a["affine"] == "group":  # one weight and bias per group, loaded once
        if a["w"] is not None:
            apply.append("    wv = tl.load(w_ptr + row).to(tl.float32)")
        if a["b"] is not None:
            apply.append("    bv = tl.load(b_ptr + row).to(tl.float32)")
    apply += [
        "    lanes = tl.arange(0, BLOCK)",
        f"    for it in tl.range(0, ITERS, num_stages={stages}):",
        f"        offs = c * {chunk} + it * BLOCK + lanes",
        f"        m = offs < {seg}",
        "        x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)",
        "        y = (x - mean) * rstd",
    ]
    if a["affine"] == "group":
        if a["w"] is not None:
            apply.append("        y = y * wv")
        if a["b"] is not None:
            apply.append("        y = y + bv")
    else:
        if a["w"] is not None:
            apply.append(f"        y = y * tl.load(w_ptr + {windex}, mask=m, other=0.0).to(tl.float32)")
        if a["b"] is not None:
            apply.append(f"        y = y + tl.load(b_ptr + {windex}, mask=m, other=0.0).to(tl.float32)")
    apply.append(f"        tl.store(out_ptr + base + offs, {store_expr('y', a['dtype'])}, mask=m)")
    kernels.append("\n".join(apply))
    return "\n\n\n".join(kernels)


class GroupNormTemplate(Template):
    name = "group_norm"
    families = ("group_norm",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["split", "finalize"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        return {"BLOCK": [64, 128, 256, 512, 1024, 2048, 4096], "ITERS": [1, 2, 4, 8, 16, 32],
                "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3], "REV": [0, 1]}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        a = fm.attrs
        block = max(64, min(2048, next_pow2(a["seg"])))
        iters = 1
        # Longer chunks while the groups still split into four programs for each of an H200's 132 SMs (the search
        # moves ITERS from there); in the interpreter, which pays per program, as few programs as the groups allow.
        want = 1 if device == "cpu" else 4 * 132
        while iters < 32 and a["rows"] * a["segs"] * -(-a["seg"] // (block * iters * 2)) >= want \
                and block * iters * 2 <= next_pow2(a["seg"]):
            iters *= 2
        return {"BLOCK": block, "ITERS": iters, "num_warps": 8 if block >= 1024 else 4, "num_stages": 1, "REV": 0}

    def alternates(self, fm: FamilyMatch, variant: str, device: str) -> list[dict[str, Any]]:
        """Half the default's tile and a quarter of its chunk length, where the default's chunks are long. On the
        H200 a BatchNorm2d over (64, 64, 512, 512) ran 3029 and 3043 us per call in two processes at 1024 x 8 against
        3151 for the default (2048 x 32): the statistics pass reads at 4.7 TB/s either way, the apply pass gains
        (docs/findings.md, "Group norms"). Judgments take a
        minute at that size, so a search reaches few shapes on its own; a seed is judged once at least."""
        if variant != "split" or device == "cpu":  # the interpreter's clock cannot tell launch shapes apart
            return []
        base = self.default(fm, variant, device)
        if base["ITERS"] < 4 or base["BLOCK"] < 128:
            return []
        alt = {**base, "BLOCK": base["BLOCK"] // 2, "ITERS": base["ITERS"] // 4}
        return [alt] if self.feasible(fm, alt, variant) else []

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        # Half the usual tile: the statistics kernel keeps a running mean and M2 per value of it.
        return elems_per_thread(params["BLOCK"], params["num_warps"]) <= MAX_ELEMS_PER_THREAD // 2 \
            and next_pow2(_chunks(fm.attrs, params)) <= 8192

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK"] * params["ITERS"])
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        a = fm.attrs
        n_chunks = _chunks(a, params)
        grid = a["rows"] * n_chunks
        launch = (f"BLOCK={int(params['BLOCK'])}, ITERS={int(params['ITERS'])}, "
                  f"num_warps={int(params['num_warps'])}, num_stages={int(params['num_stages'])}")
        w = f"{fm.operand(a['w'])}.contiguous()" if a["w"] is not None else "x"
        b = f"{fm.operand(a['b'])}.contiguous()" if a["b"] is not None else "x"
        # Running statistics and the batch counter are buffers, updated in place (never copies).
        rm, rv = (fm.operand(a["running"][0]), fm.operand(a["running"][1])) if a["running"] else ("x", "x")
        nbt = fm.operand(a["counter"]) if a["counter"] else "x"
        body = [
            f"x = {fm.operand(a['x'])}.contiguous()",
            f"part = torch.empty({2 * grid}, dtype=torch.float32, device=x.device)",
            f"out = torch.empty({list(a['out_shape'])!r}, dtype={torch_dtype(a['dtype'])}, device=x.device)",
            f"_group_stats[({grid},)](x, part, {launch})",
        ]
        if variant == "finalize":
            body += [
                f"stat = torch.empty({2 * a['rows']}, dtype=torch.float32, device=x.device)",
                f"_group_final[({a['rows']},)](part, stat, {rm}, {rv}, {nbt}, CP={next_pow2(n_chunks)}, num_warps=4)",
                f"_group_apply[({grid},)](x, stat, {w}, {b}, out, {launch})",
            ]
        else:
            body.append(f"_group_apply[({grid},)](x, part, {w}, {b}, out, {rm}, {rv}, {nbt}, {launch}, "
                        f"CP={next_pow2(n_chunks)})")
        body.append("return out")
        what = {"channel": "group norm", "element": "layer norm over several dims", "group": "batch norm",
                "none": "batch norm" if a["segs"] > 1 else "instance norm"}
        return module_source(fm, f"{what[a['affine']]} of {a['rows']} groups of {a['length']} values, in chunks of "
                             f"{int(params['BLOCK']) * int(params['ITERS'])}, rendered by kernelsmith.",
                             _kernels(a, params, variant), body)


register(Family("group_norm", priority=100, match=match, templates=(GroupNormTemplate(),)))
