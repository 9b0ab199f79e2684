"""Row-wise ops with the whole row in registers: RMSNorm, LayerNorm, softmax, log-softmax, vector norms, and any
fusion of pointwise ops with reductions over the last dim, over several trailing dims (flattened into one row), or
over dims with others after them (the "strided" variant: RMSNorm over the channels of an NCHW tensor, where a row
is the C values of one (n, h, w) position, C strides apart, and a program takes ROWS neighbouring positions, so
its loads are contiguous along the rows).

The problem's own aten graph is lowered node by node onto a [ROWS, BLOCK_N] tile, so the kernel rounds where the
reference rounds and fuses whatever pointwise work surrounds the reduction. Variants: one block of rows per
program; a persistent grid that walks row blocks and loads the broadcast vectors (weights) once; and that
grid software-pipelined ("prefetch"): the loads of a program's next row block are issued before the current block
is reduced and stored, so one resident program keeps memory busy while it computes. That matters for long rows
(softmax over a vocabulary), where a row fills the registers and only one program fits on an SM.

Long rows have a second template, the chunked online softmax (``softmax_online``, softmax and log-softmax over the
last dim): an online max/sum sweep, then a write sweep. It reads the row twice; with L2HINT the first sweep asks
L2 to keep the row and the second to drop it, so the second read can come from L2 rather than memory. CHUNK_MAX
keeps one running max per row (a block reduction per chunk, one exponential per element) instead of one per lane
(no reduction in the loop, but a second exponential per element for the rescaling, which at bf16 bandwidth can
make the special-function unit the bottleneck). Its ``online_tail`` variant writes from the row's end back to its
start: where all rows in flight together exceed L2, a forward second sweep finds every chunk evicted (the cache
keeps the most recent reads, and the sweep asks first for the oldest), while a backward one finds the chunks the
first sweep read last.
"""

from __future__ import annotations

import re
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    ITEMSIZE,
    MAX_ELEMS_PER_THREAD,
    SM_COUNT_HELPER,
    SMEM_BYTES,
    Template,
    TemplateError,
    elems_per_thread,
    module_source,
    next_pow2,
    output_refs,
    rounding_default,
    rounding_space,
    torch_dtype,
)
from ks_inductor.seeds.graph import VIEW_OPS, Graph, Node, Ref
from ks_inductor.seeds.pointwise import (
    PointwiseUnsupported,
    Val,
    exp_shifted,
    is_pointwise,
    literal,
    lower_node,
    reduce_expr,
    round_expr,
    store_expr,
    unfenced,
)

ROW_REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "native_layer_norm", "_softmax", "_log_softmax")


def _dims_of(node: Node, ndim: int) -> tuple[tuple[int, ...], bool] | None:
    """The dims a row reduction reduces (sorted, non-negative) and whether it keeps them, or None if not readable."""
    if node.op == "native_layer_norm":
        shape = node.args[1]
        if not isinstance(shape, list) or len(shape) != 1:
            return None
        return (ndim - 1,), True
    if node.op in ("_softmax", "_log_softmax"):
        d = node.args[1]
        return ((d % ndim,), True) if isinstance(d, int) else None
    if node.op == "linalg_vector_norm":
        dims = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        keep = node.args[3] if len(node.args) > 3 else node.kwargs.get("keepdim", False)
    elif node.op == "var":
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keep = node.kwargs.get("keepdim", False)
    else:
        dims = node.args[1] if len(node.args) > 1 else None
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(sorted(d % ndim for d in dims)), bool(keep)


def _row_dims(graph: Graph) -> tuple[int, int] | None:
    """The block of dims (first, last) that every reduction of a row-wise graph reduces, or None if the graph is not
    row-wise: every compute node pointwise or a reduction over one contiguous block of dims of a full-rank value,
    with the dims kept. The block is the last dim (a row op as LLM serving has them), several trailing dims
    (LayerNorm over (C, H, W), InstanceNorm: rows once flattened), or dims with others after them (RMSNorm over the
    channels of an NCHW tensor: the template strides over them). Every output has the full shape, which is what the
    row-wise template writes; a lone reduction is the reduction family's."""
    ndim = None
    full: list[int] = []
    block: tuple[int, ...] | None = None
    for n in graph.compute_nodes():
        if is_pointwise(n):
            continue
        if n.op not in ROW_REDUCTIONS and n.op != "linalg_vector_norm":
            return None
        src = graph.type_of(n.args[0].name) if n.args and isinstance(n.args[0], Ref) else None
        if src is None or not src.shape or (ndim is not None and len(src.shape) != ndim):
            return None
        ndim, full = len(src.shape), src.shape
        got = _dims_of(n, ndim)
        if got is None or not got[1]:
            return None
        dims = got[0]
        if list(dims) != list(range(dims[0], dims[0] + len(dims))) or (block is not None and dims != block):
            return None
        block = dims
    if ndim is None or block is None:
        return None
    for n in graph.nodes:
        if n.op in VIEW_OPS and n.op not in ("getitem", "alias", "detach", "clone"):
            return None
    for o in graph.outputs:
        t = graph.type_of(o.name) if isinstance(o, Ref) else None
        if t is None or t.shape != full:
            return None
    return block[0], block[-1]


_NEUTRAL = {"sum": "0.0", "mean": "0.0", "amax": "(-float('inf'))", "amin": "float('inf')"}


def match(graph: Graph) -> dict[str, Any] | None:
    dims = _row_dims(graph)
    return None if dims is None else {"dims": list(dims)}


def kind(graph: Graph, attrs: dict[str, Any]) -> str:
    """Which row op the graph is, by its ops: the name is recorded with every run, and softmax and log-softmax
    also get the online softmax template."""
    ops = set(graph.ops())
    if ops & {"_softmax", "_log_softmax"} and len(ops - {"_to_copy"}) == 1:
        return "log_softmax" if "_log_softmax" in ops else "softmax"
    if "native_layer_norm" in ops or ({"mean", "sub"} <= ops and ops & {"var", "pow"}
                                       and ops & {"rsqrt", "sqrt", "div"}):
        return "layernorm"
    if "mean" in ops and ops & {"rsqrt", "sqrt"} and ops & {"pow", "mul"}:
        return "rmsnorm"
    if {"amax", "exp", "sum"} <= ops:
        return "softmax"
    return "rowwise"


def _row_shape(fm: FamilyMatch) -> list[int]:
    shapes = [t.shape for _, t in fm.graph.placeholders if t is not None and t.shape]
    full = max(shapes, key=len)
    return full


def _geometry(fm: FamilyMatch) -> tuple[int, int, int, int]:
    """(first reduced dim, outer, reduced, inner) element counts: the input seen as [outer, reduced, inner]."""
    full = _row_shape(fm)
    d0, d1 = fm.row_dims
    outer = reduced = inner = 1
    for i, n in enumerate(full):
        if i < d0:
            outer *= n
        elif i <= d1:
            reduced *= n
        else:
            inner *= n
    return d0, outer, reduced, inner


def _is_vector(t: Any, full: list[int]) -> bool:
    """A value of N elements along the row, broadcast over the rows (the template loads it once per program)."""
    return t.numel == full[-1] and bool(t.shape) and t.shape[-1] == full[-1]


def _stats_tile(fm: FamilyMatch) -> str | None:
    """The row tile a LayerNorm normalizes when it reads one as it is, else None: the one-pass statistics (STATS=1)
    take their shift from the tile's first column, loaded on its own."""
    for node in fm.graph.nodes:
        if node.op == "native_layer_norm":
            a0 = node.args[0]
            t = fm.graph.type_of(a0.name) if isinstance(a0, Ref) else None
            if t is not None and t.shape == _row_shape(fm) and a0.name in dict(fm.graph.placeholders):
                return a0.name
    return None


def _lower(fm: FamilyMatch, lowp: bool = False, fastexp: bool = False,
           stats: bool = False) -> tuple[list[str], dict[str, str], list[str]]:
    """Kernel body lines, the loads (placeholder -> kind) and the output value names.

    ``lowp`` keeps row tiles in their storage dtype and widens them at each use, and writes softmax as
    exp(x - logsumexp): no fp32 copy of the row has to live across the reductions, which frees registers for
    more rows in flight on long rows. ``fastexp`` computes softmax exponentials with ``pointwise.exp_shifted``'s
    flushing hardware form."""
    g = fm.graph
    full = _row_shape(fm)
    vectors_ok = fm.rows_are_last_dim
    env: dict[str, Val] = {}
    loads: dict[str, str] = {}
    lines: list[str] = []
    for p, t in g.placeholders:
        if t is None:
            continue
        if t.shape == full:
            loads[p] = "tile"
        elif vectors_ok and _is_vector(t, full):
            loads[p] = "vec"
        elif t.numel == 1:
            loads[p] = "scalar"
        else:
            raise TemplateError(f"input {p} of shape {t.shape} is neither a full row tile nor a [N] vector")
        env[p] = Val(f"v_{p}.to(tl.float32)" if lowp and loads[p] == "tile" else f"v_{p}")

    def red(op: str, v: str, keep_shape: bool = True) -> str:
        masked = f"tl.where(mask, {v}, {_NEUTRAL[op]})"
        if op in ("amax", "amin"):
            return f"{reduce_expr(op, masked, 1)}[:, None]"
        return f"tl.sum({masked}, axis=1)[:, None]"

    free = unfenced(g.nodes)
    for node in g.nodes:
        name = f"x_{node.name}"
        a0 = node.args[0] if node.args else None
        src = env[a0.name].expr if isinstance(a0, Ref) and a0.name in env else None
        t = node.type
        out_dtype = t.dtype if t is not None else "float32"

        fence = node.name not in free

        def rnd(e: str, dt: str = out_dtype, fence: bool = fence) -> str:
            return round_expr(e, dt, fence)

        if node.op == "getitem":
            if node.args[1] != 0 or a0.name not in env:
                raise TemplateError("only the first output of a fused norm can be used")
            env[node.name] = env[a0.name]
            continue
        if node.op in ("alias", "detach", "clone"):
            env[node.name] = env[a0.name]
            continue
        if node.op in ("sum", "mean", "amax", "amin"):
            expr = red(node.op, src)
            if node.op == "mean":
                expr = f"({expr} / n_cols)"
            lines.append(f"{name} = {rnd(expr)}")
        elif node.op == "linalg_vector_norm":
            order = node.args[1] if len(node.args) > 1 else node.kwargs.get("ord", 2)
            if node.kwargs.get("dtype") is not None or not isinstance(order, (int, float)):
                raise TemplateError("linalg_vector_norm with a dtype or a non-numeric ord")
            a = f"tl.abs({src})"
            if order == 2:
                expr = f"tl.sqrt({red('sum', f'{src} * {src}')})"
            elif order == 1:
                expr = red("sum", a)
            elif order == float("inf"):
                expr = red("amax", a)
            elif order == float("-inf"):
                expr = red("amin", a)
            else:
                raise TemplateError(f"linalg_vector_norm of ord {order}")
            lines.append(f"{name} = {rnd(expr)}")
        elif node.op == "var":
            corr = node.kwargs.get("correction", 1)
            lines += [f"{name}_m = tl.sum(tl.where(mask, {src}, 0.0), axis=1)[:, None] / n_cols",
                      f"{name}_c = tl.where(mask, {src} - {name}_m, 0.0)",
                      f"{name} = {rnd(f'tl.sum({name}_c * {name}_c, axis=1)[:, None] / (n_cols - {literal(corr)})')}"]
        elif node.op == "native_layer_norm":
            w, b, eps = node.args[2], node.args[3], node.args[4]
            if stats and a0.name == _stats_tile(fm):
                # One pass: the sums of d = x - k and d * d in one reduction, k the row's first value.
                # E[d^2] - E[d]^2 loses at most log2(n + 1) bits to cancellation, since (k - mean)^2 <= n * var for
                # any k of the row; the two-pass form pays a second block-wide reduction, after the first.
                lines += [f"{name}_k = tl.load({a0.name}_ptr + r64 * {a0.name}_s0, mask=rmask[:, None], other=0.0)"
                          ".to(tl.float32)",
                          f"{name}_d = tl.where(mask, {src} - {name}_k, 0.0)",
                          f"{name}_s1, {name}_s2 = tl.reduce(({name}_d, {name}_d * {name}_d), 1, _add_pair)",
                          f"{name}_m = {name}_s1[:, None] / n_cols",
                          f"{name}_r = tl.rsqrt({name}_s2[:, None] / n_cols - {name}_m * {name}_m + {literal(eps)})",
                          f"{name} = ({name}_d - {name}_m) * {name}_r"]
            else:
                lines += [f"{name}_m = tl.sum(tl.where(mask, {src}, 0.0), axis=1)[:, None] / n_cols",
                          f"{name}_c = tl.where(mask, {src} - {name}_m, 0.0)",
                          f"{name}_r = tl.rsqrt(tl.sum({name}_c * {name}_c, axis=1)[:, None] / n_cols + {literal(eps)})",
                          f"{name} = {name}_c * {name}_r"]
            if isinstance(w, Ref):
                lines.append(f"{name} = {name} * {env[w.name].expr}")
            if isinstance(b, Ref):
                lines.append(f"{name} = {name} + {env[b.name].expr}")
            lines.append(f"{name} = {rnd(name)}")
        elif node.op in ("_softmax", "_log_softmax"):
            # tl.max may skip a NaN here (max_expr's note); its exponential still makes the row sum, and so the
            # whole row, NaN, as torch's is.
            lines.append(f"{name}_m = tl.max(tl.where(mask, {src}, -float('inf')), axis=1)[:, None]")
            if node.op == "_softmax" and lowp:
                # exp recomputed against the log-sum-exp: no fp32 row of exponentials stays live.
                lines += [f"{name}_s = tl.sum(tl.where(mask, {exp_shifted(src, f'{name}_m', fastexp)}, 0.0), "
                          "axis=1)[:, None]",
                          f"{name} = {rnd(exp_shifted(src, f'{name}_m + tl.log({name}_s)', fastexp))}"]
            else:
                lines += [f"{name}_e = tl.where(mask, {exp_shifted(src, f'{name}_m', fastexp)}, 0.0)",
                          f"{name}_s = tl.sum({name}_e, axis=1)[:, None]"]
                if node.op == "_softmax":
                    # One reciprocal per row instead of a division per element (fp32 division is a long sequence).
                    lines.append(f"{name} = {rnd(f'{name}_e * (1.0 / {name}_s)')}")
                else:
                    lines.append(f"{name} = {rnd(f'{src} - {name}_m - tl.log({name}_s)')}")
        elif is_pointwise(node):
            try:
                line, val = lower_node(node, env, fence)
            except PointwiseUnsupported as e:
                raise TemplateError(str(e)) from None
            lines.append(line)
            env[node.name] = val
            continue
        else:
            raise TemplateError(f"aten.{node.op} cannot be lowered row-wise")
        env[node.name] = Val(name)
    outs = output_refs(g)
    for o in outs:
        ot = g.type_of(o)
        if ot is None or ot.shape != full:
            raise TemplateError("every output must have the full row shape")
    return lines, loads, [env[o].expr for o in outs]


def _staged_bytes(fm: FamilyMatch, params: dict[str, Any]) -> int:
    """Shared memory the persistent variant's pipelined row loads take: num_stages - 1 blocks of every row tile."""
    full = _row_shape(fm)
    per_row = sum(ITEMSIZE.get(t.dtype, 4) for _, t in fm.graph.placeholders if t is not None and t.shape == full)
    return max(0, params.get("num_stages", 1) - 1) * params["ROWS"] * next_pow2(full[-1]) * per_row


def _fastexp_offered(fm: FamilyMatch) -> bool:
    """FASTEXP (``pointwise.exp_shifted``) is a choice where a softmax has exponentials and the target has the
    hardware exp2 (the interpreter renders the exact one, so offering it there would only widen the search)."""
    return fm.target != "cpu" and any(n.op in ("_softmax", "_log_softmax") for n in fm.graph.nodes)


def _has_vectors(fm: FamilyMatch) -> bool:
    """Whether the op reads a broadcast [N] vector (a norm's weight or bias)."""
    full = _row_shape(fm)
    return any(t is not None and t.shape != full and _is_vector(t, full) for _, t in fm.graph.placeholders)


def _load_before_first_use(lines: list[str], loads: dict[str, str]) -> list[str]:
    """``lines`` with each ``loads[p]`` inserted before the first line that reads ``v_p``."""
    out: list[str] = []
    pending = dict(loads)
    for ln in lines:
        for p in [p for p in pending if re.search(rf"\bv_{p}\b", ln)]:
            out.append(pending.pop(p))
        out.append(ln)
    return out + list(pending.values())


class RowwiseTemplate(Template):
    name = "rowwise"
    families = ("rmsnorm", "layernorm", "softmax", "log_softmax", "rowwise")

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["strided"] if _geometry(fm)[3] > 1 else ["block", "persistent", "prefetch"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        if variant == "strided":
            return {"ROWS": [4, 8, 16, 32, 64, 128, 256, 512], "num_warps": [1, 2, 4, 8, 16], "EVICT": [0, 1, 2],
                    "LOWP": [0, 1], **rounding_space(fm)}
        # Stages only pipeline loops; the one-block variant has none, so they are not a knob there.
        s: dict[str, list[Any]] = {"ROWS": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16, 32], "EVICT": [0, 1, 2],
                                   "LOWP": [0, 1]}
        if variant == "persistent":
            s["WAVES"] = [1, 2, 4, 8]
            s["num_stages"] = [1, 2, 3, 4]
        if variant == "prefetch":  # the explicit prefetch is the pipelining: no stages
            s["WAVES"] = [1, 2, 4, 8]
        if _fastexp_offered(fm):
            s["FASTEXP"] = [0, 1]
        if _stats_tile(fm) is not None:
            s["STATS"] = [0, 1]
        if variant == "block" and _has_vectors(fm):
            s["LATEVEC"] = [0, 1]
            s["VEVICT"] = [0, 1]
            s["VFIRST"] = [0, 1]
        return {**s, **rounding_space(fm)}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        tile = params["ROWS"] * next_pow2(_geometry(fm)[2])
        # The prefetched block is held, in its storage dtype, next to the one being computed.
        per_thread = elems_per_thread(tile, params["num_warps"]) * (1.5 if variant == "prefetch" else 1)
        staged_ok = variant != "persistent" or _staged_bytes(fm, params) <= SMEM_BYTES
        pinned_late = bool(params.get("VFIRST")) and bool(params.get("LATEVEC"))  # two places for the same loads
        return per_thread <= MAX_ELEMS_PER_THREAD and staged_ok and not pinned_late

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        n = next_pow2(_geometry(fm)[2])
        if variant == "strided":
            # A tile of about 8192 values, as for rows, with at least a few positions per program so that the
            # loads run contiguous along them.
            rows = max(4, min(512, 8192 // n, next_pow2(_geometry(fm)[3])))
            return {"ROWS": rows, "num_warps": max(1, min(16, next_pow2(n * rows // 1024))), "EVICT": 0, "LOWP": 0,
                    **rounding_default(fm)}
        # 8192 values per program, 32 per thread: on the H200, 4 of 6 searches over the 4096-wide norms ended on 2
        # rows and 8 warps; the other two ended on 1 row (docs/findings.md, "Row-wise norms").
        rows = max(1, min(16, 8192 // n))
        warps = max(1, min(32, next_pow2(n * rows // 1024)))
        p: dict[str, Any] = {"ROWS": rows, "num_warps": warps, "EVICT": 0, "LOWP": 0}
        if variant == "persistent":
            p["WAVES"] = 2
            p["num_stages"] = 1
            if n >= 16384:
                # A row too long to hold twice in registers: one program per SM with 3 stages, so the next two rows
                # are in flight (cp.async into shared memory) while one is reduced. On the H200 a 4096 x 32000 bf16
                # softmax of that shape took 134.8 us per call against 140.6 for the row prefetched in registers;
                # rendered by this template, 137.9 against 144.9 for one stage on the launch alone
                # (benchmarks/results/l2-state-nvidia-h200-2026-11-23.json).
                p.update(num_warps=max(1, min(32, next_pow2(n * rows // 1024))), WAVES=1, num_stages=3, EVICT=1)
        if variant == "prefetch":
            # One resident program per SM, with the row and the next one in registers: at most 32 of the row's
            # values per thread. On the H200 the 4096 x 32000 softmax took 139 us with 32 warps and 151 with 16
            # (docs/findings.md, "Softmax").
            p["num_warps"] = max(1, min(32, next_pow2(n * rows // 1024)))
            p["WAVES"] = 1
            p["EVICT"] = 1
        if _fastexp_offered(fm):
            # On the H200 the flushing exp took the whole-row bf16 softmax from 163 to 139 us
            # (docs/findings.md, "Softmax").
            p["FASTEXP"] = 1
        if _stats_tile(fm) is not None:
            # Not measured faster per call on the H200 (19.5 us either way, docs/findings.md, "Row-wise norms").
            p["STATS"] = 0
        if variant == "block" and _has_vectors(fm):
            p["LATEVEC"] = 0
            p["VEVICT"] = 0
            p["VFIRST"] = 0
        return {**p, **rounding_default(fm)}

    def alternates(self, fm: FamilyMatch, variant: str, device: str) -> list[dict[str, Any]]:
        """For one block of rows per program: the default's tile over twice the threads, half the tile over half
        the threads, the wider one with streamed rows (EVICT=2), and, where there are broadcast vectors, the default
        asking the caches to keep them (VEVICT=1), and the default's tile over half the threads with those loads kept
        ahead of the rows' (VFIRST=1), and, for a LayerNorm, the one below. Each is one to three moves from the
        default, and the first three sit within 2% of one another on a 4096-wide RMSNorm on the H200, closer than one
        judgment separates: per call 19.2, 19.3 and 19.4 us against 19.5 for the default (2 rows, 8 warps), in a CUDA
        graph 18.5, 18.8 and 18.3 against 18.7
        (docs/findings.md, "Row-wise norms"). The VFIRST one is where a 4096-wide LayerNorm search can end: 18.7 and
        19.0 us per call in two processes against 18.8 and 19.1 for 2 rows over 8 warps unpinned, 18.3 against 19.4
        in a CUDA graph.
        Where a LayerNorm reads its rows as they are: half the default's tile over half its threads with the vectors
        pinned and one-pass statistics (STATS=1), three moves from the default and one the searches did not reach. On
        the H200 (triton 3.6), 4096 wide, 1 row and 4 warps of it took 72 registers (seven programs per SM, where the
        2-row 4-warp pinned form's 128 fit four) and ran ahead of that form in four processes: per call 18.98, 18.46,
        18.75 and 19.58 us against 19.14, 18.59, 18.88 and 19.74; in a CUDA graph 18.06, 18.05, 18.15 and 18.17
        against 18.28, 18.26, 18.35 and 18.36 (docs/findings.md, "Row-wise norms").
        Seeded, each is judged once at least."""
        if variant != "block" or device == "cpu":  # the interpreter's clock cannot tell launch shapes apart
            return []
        base = self.default(fm, variant, device)
        space = self.space(fm, variant)
        wider = {**base, "num_warps": base["num_warps"] * 2}
        narrower = {**base, "ROWS": base["ROWS"] // 2, "num_warps": base["num_warps"] // 2}
        streamed = {**(wider if wider["num_warps"] in space["num_warps"] else base), "EVICT": 2}
        kept = {**base, "VEVICT": 1} if "VEVICT" in space else base
        pinned = {**base, "num_warps": max(1, base["num_warps"] // 2), "VFIRST": 1} if "VFIRST" in space else base
        one_pass = {**narrower, "VFIRST": 1, "STATS": 1} if "VFIRST" in space and "STATS" in space else base
        out: list[dict[str, Any]] = []
        for p in (wider, narrower, streamed, kept, pinned, one_pass):
            ok = all(p[k] in space[k] for k in ("ROWS", "num_warps", "EVICT")) and self.feasible(fm, p, variant)
            if ok and p != base and p not in out:
                out.append(p)
        return out

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        lines, loads, outs = _lower(fm, bool(params.get("LOWP", 0)), bool(params.get("FASTEXP", 0)),
                                    bool(params.get("STATS", 0)))
        g = fm.graph
        tiles = [p for p, k in loads.items() if k == "tile"]
        vecs = [p for p, k in loads.items() if k == "vec"]
        scalars = [p for p, k in loads.items() if k == "scalar"]
        if not tiles:
            raise TemplateError("no full-row input")
        out_names = [f"out{i}" for i in range(len(outs))]
        strided = variant == "strided"
        sig = (", ".join(f"{p}_ptr" for p in loads) + ", " + ", ".join(f"{o}_ptr" for o in out_names)
               + ", n_rows, n_cols, " + ", ".join(f"{p}_s0, {p}_s1" for p in tiles) + ", "
               + ", ".join(f"{o}_s0" for o in out_names))
        if strided:
            sig += ", " + ", ".join([f"{p}_so" for p in tiles] + [f"{o}_s1, {o}_so" for o in out_names])
        persistent = variant in ("persistent", "prefetch")
        pipelined = variant == "prefetch"
        # EVEN (the launch found no ragged row block or column tail): all-true masks, which the compiler folds
        # away with the selects of the masked reductions; that was a tenth of a LayerNorm's instructions.
        k: list[str] = ["@triton.jit",
                        f"def _row_kernel({sig}, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):",
                        "    cols = tl.arange(0, BLOCK_N)",
                        "    cmask = tl.full([BLOCK_N], 1, tl.int1) if EVEN else cols < n_cols"]
        if strided:
            # One grid axis over (outer index, block of inner positions): grid axes past the first stop at 65535,
            # and either count can pass that. Each program's rows are neighbouring inner positions.
            k += ["    inner_blocks = tl.cdiv(n_rows, ROWS)",
                  "    outer = (tl.program_id(0) // inner_blocks).to(tl.int64)"]
            k += [f"    {p}_ptr += outer * {p}_so" for p in tiles] + [f"    {o}_ptr += outer * {o}_so" for o in out_names]
        # VEVICT: every program of the one-block variant reads the broadcast vectors again; evict_last asks the
        # caches to keep them over the streamed rows. On the H200 that took a 4096-wide LayerNorm's late vector
        # loads from 20.2 to 19.9 us per call at 2 rows and 8 warps, from 20.7 to 20.0 at 1 row and 4 warps
        # (docs/findings.md, "Row-wise norms").
        v_hint = ', eviction_policy="evict_last"' if params.get("VEVICT") else ""
        vec_loads = {p: f"v_{p} = tl.load({p}_ptr + cols, mask=cmask, other=0.0{v_hint}).to(tl.float32)[None, :]"
                     for p in vecs}
        late = bool(params.get("LATEVEC")) and not persistent
        if late:
            # Each broadcast vector is loaded (from L2: every program reads it) right before its first use, after
            # the reductions, instead of living in registers through them. On a 4096-wide LayerNorm of 16 warps
            # that took the kernel from 40 to 32 registers, so four programs of 512 threads fit an SM, not three:
            # 20.3 -> 19.2 us per call on the H200. The 8-warp form, already at four programs, gained nothing
            # (19.0 -> 19.1; docs/findings.md, "Row-wise norms").
            lines = _load_before_first_use(lines, vec_loads)
        else:
            k += ["    " + ln for ln in vec_loads.values()]
            if params.get("VFIRST") and vec_loads:
                # Compiled for sm_90 the vector loads sink below the row loads, to just before the first block-wide
                # reduction, whatever their place here; a barrier keeps them first. On the H200, 4096 wide: RMSNorm
                # of 1 row and 8 warps 18.3 -> 17.7 us back to back in a CUDA graph, level per call; LayerNorm of 2
                # rows and 4 warps 19.6 -> 18.7 per call and 19.2 -> 18.3 in a graph, but of 2 rows and 8 warps
                # 18.8 -> 19.5 per call. So a knob for the search, not a default
                # (docs/findings.md, "Row-wise norms").
                k.append("    tl.debug_barrier()")
        for p in scalars:
            k.append(f"    v_{p} = tl.load({p}_ptr).to(tl.float32)")
        # Row tiles are read once: evict_first keeps L2 for the broadcast vectors. EVICT=2 also streams the
        # stores (.cs), which are not read again by this kernel either.
        evict = ', eviction_policy="evict_first"' if params.get("EVICT") else ""
        st_hint = ', cache_modifier=".cs"' if params.get("EVICT") == 2 else ""
        widen = "" if params.get("LOWP") else ".to(tl.float32)"

        def prefetch(ind: str, rows: str) -> list[str]:
            """The raw (storage-dtype) tiles of ``rows`` into the loop-carried n_* names."""
            out = [ind + f"n_r64 = ({rows}).to(tl.int64)[:, None]",
                   ind + f"n_mask = (({rows}) < n_rows)[:, None] & cmask[None, :]"]
            for p in tiles:
                out.append(ind + f"n_{p} = tl.load({p}_ptr + n_r64 * {p}_s0 + cols[None, :] * {p}_s1, "
                           f"mask=n_mask, other=0.0{evict})")
            return out

        ind = "    "
        if persistent:
            k.append("    n_blocks = tl.cdiv(n_rows, ROWS)")
            if pipelined:
                # Loop-carried raw tiles: block i+1's loads are in flight while block i is computed.
                k += prefetch(ind, "tl.program_id(0) * ROWS + tl.arange(0, ROWS)")
                k.append("    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):")
            else:
                # The stages go on the loop itself: given only to the launch, they leave loads that feed no dot
                # unpipelined (sm_90: 128 B of shared memory against 131,200 with them on the loop, 4096 x 32000).
                k.append("    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), "
                         f"num_stages={int(params.get('num_stages', 1))}):")
            ind = "        "
            k.append(ind + "rows = blk * ROWS + tl.arange(0, ROWS)")
        elif strided:
            k.append(ind + "rows = (tl.program_id(0) % inner_blocks) * ROWS + tl.arange(0, ROWS)")
        else:
            k.append(ind + "rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)")
        k += [ind + "rmask = tl.full([ROWS], 1, tl.int1) if EVEN else rows < n_rows",
              ind + "mask = rmask[:, None] & cmask[None, :]",
              ind + "r64 = rows.to(tl.int64)[:, None]"]
        if pipelined:
            k += [ind + f"v_{p} = n_{p}{widen}" for p in tiles]
            k += prefetch(ind, "(blk + tl.num_programs(0)) * ROWS + tl.arange(0, ROWS)")
        else:
            for p in tiles:
                k.append(ind + f"v_{p} = tl.load({p}_ptr + r64 * {p}_s0 + cols[None, :] * {p}_s1, mask=mask, "
                         f"other=0.0{evict}){widen}")
        k += [ind + ln for ln in lines]
        out_cols = "cols[None, :]" + (" * {o}_s1" if strided else "")
        for o, v, ref in zip(out_names, outs, output_refs(g)):
            k.append(ind + f"tl.store({o}_ptr + r64 * {o}_s0 + {out_cols.format(o=o)}, "
                     f"{store_expr(v, g.type_of(ref).dtype)}, mask=mask{st_hint})")
        kernel = "\n".join(k)

        f: list[str] = []
        main = fm.operand(tiles[0])
        if strided:
            return self._render_strided(fm, params, kernel, list(loads), tiles, out_names)
        d0 = _geometry(fm)[0] - len(_row_shape(fm))  # from the end, so leading dims may vary
        if d0 == -1:
            f.append(f"n_cols = {main}.shape[-1]")
            f.append(f"lead = {main}.shape[:-1]")
        else:  # several trailing dims, one row once flattened
            f.append(f"n_cols = {main}.shape[{d0}:].numel()")
            f.append(f"lead = {main}.shape[:{d0}]")
        for p in tiles:
            f.append(f"t_{p} = {fm.operand(p)}.reshape(-1, n_cols)")
        for p in vecs:
            f.append(f"t_{p} = {fm.operand(p)}.reshape(-1).contiguous()")
        for p in scalars:
            f.append(f"t_{p} = {fm.operand(p)}.reshape(-1)")
        f.append(f"n_rows = t_{tiles[0]}.shape[0]")
        for o, ref in zip(out_names, output_refs(g)):
            f.append(f"{o} = torch.empty((n_rows, n_cols), dtype={torch_dtype(g.type_of(ref).dtype)}, "
                     f"device={main}.device)")
        f.append("BLOCK_N = triton.next_power_of_2(n_cols)")
        f.append(f"ROWS = {int(params['ROWS'])}")
        f.append("n_blocks = triton.cdiv(n_rows, ROWS)")
        if persistent:
            f.append(f"grid = (max(1, min(n_blocks, _sm_count({main}) * {int(params['WAVES'])})),)")
        else:
            f.append("grid = (n_blocks,)")
        call = (", ".join(f"t_{p}" for p in loads) + ", " + ", ".join(out_names) + ", n_rows, n_cols, "
                + ", ".join(f"t_{p}.stride(0), t_{p}.stride(1)" for p in tiles) + ", "
                + ", ".join(f"{o}.stride(0)" for o in out_names))
        f.append(f"_row_kernel[grid]({call}, ROWS=ROWS, BLOCK_N=BLOCK_N, EVEN=n_cols == BLOCK_N and n_rows % ROWS == 0, "
                 f"num_warps={int(params['num_warps'])}, "
                 f"num_stages={int(params.get('num_stages', 1))})")
        rets = [f"{o}.view(*lead, n_cols)" if d0 == -1 else f"{o}.view({main}.shape)" for o in out_names]
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        return module_source(fm, f"Row-wise {fm.family} ({variant}), rendered by kernelsmith.", kernel, f,
                             SM_COUNT_HELPER if persistent else "", params)

    def _render_strided(self, fm: FamilyMatch, params: dict[str, Any], kernel: str, loads: list[str],
                        tiles: list[str], out_names: list[str]) -> str:
        """The forward of the strided variant: every tile seen as [outer, reduced, inner], one program per block of
        inner positions of each outer index."""
        g = fm.graph
        main = fm.operand(tiles[0])
        ndim = len(_row_shape(fm))
        first, last = fm.row_dims
        a, b = first - ndim, last + 1 - ndim  # from the end, so leading dims may vary; b < 0 here
        f = [f"shape = {main}.shape",
             f"n_cols = shape[{a}:{b}].numel()",
             f"inner = shape[{b}:].numel()",
             f"outer = shape[:{a}].numel()"]
        for p in loads:
            f.append(f"t_{p} = {fm.operand(p)}.reshape(outer, n_cols, inner)" if p in tiles
                     else f"t_{p} = {fm.operand(p)}.reshape(-1)")
        for o, ref in zip(out_names, output_refs(g)):
            f.append(f"{o} = torch.empty((outer, n_cols, inner), dtype={torch_dtype(g.type_of(ref).dtype)}, "
                     f"device={main}.device)")
        f.append("BLOCK_N = triton.next_power_of_2(n_cols)")
        f.append(f"ROWS = {int(params['ROWS'])}")
        f.append("grid = (triton.cdiv(inner, ROWS) * outer,)")
        call = (", ".join(f"t_{p}" for p in loads) + ", " + ", ".join(out_names)
                + ", inner, n_cols, " + ", ".join(f"t_{p}.stride(2), t_{p}.stride(1)" for p in tiles) + ", "
                + ", ".join(f"{o}.stride(2)" for o in out_names) + ", "
                + ", ".join([f"t_{p}.stride(0)" for p in tiles] + [f"{o}.stride(1), {o}.stride(0)" for o in out_names]))
        f.append(f"_row_kernel[grid]({call}, ROWS=ROWS, BLOCK_N=BLOCK_N, EVEN=n_cols == BLOCK_N and inner % ROWS == 0, "
                 f"num_warps={int(params['num_warps'])}, num_stages=1)")
        rets = [f"{o}.view(shape)" for o in out_names]
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        return module_source(fm, f"Row-wise {fm.family} (strided), rendered by kernelsmith.", kernel, f, "", params)


# The second template: rows too long to hold in registers, read in chunks (see the module's docstring).
_ONLINE_KERNEL = '''
@triton.jit
def _softmax_online(x_ptr, out_ptr, n_cols, sx, so, BLOCK: tl.constexpr, LOG: tl.constexpr,
                    CHUNK_MAX: tl.constexpr, KEEP: tl.constexpr, DROP: tl.constexpr, STAGES: tl.constexpr,
                    TAIL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if CHUNK_MAX:
        m_s = tl.full([], -float('inf'), tl.float32)
        s_s = tl.full([], 0.0, tl.float32)
    else:
        m = tl.full([BLOCK], -float('inf'), tl.float32)
        s = tl.zeros([BLOCK], dtype=tl.float32)
    for off in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = off + cols
        cm = c < n_cols
        x = tl.load(x_ptr + row * sx + c, mask=cm, other=-float('inf'), eviction_policy=KEEP).to(tl.float32)
        if CHUNK_MAX:
            # -inf entries (masked lanes, masked logits) add nothing, even while the running max is -inf.
            m_new = tl.maximum(m_s, tl.max(x, axis=0))
            alpha = tl.where(m_new == -float('inf'), 1.0, tl.exp(m_s - m_new))
            s_s = s_s * alpha + tl.sum(tl.where(x == -float('inf'), 0.0, tl.exp(x - m_new)), axis=0)
            m_s = m_new
        else:
            # NaN kept: a lane that saw only NaN and -inf would otherwise keep m = -inf, and the fold below drops
            # such lanes' sums, NaN included, where torch's row is all NaN.
            m_new = tl.maximum(m, x, propagate_nan=tl.PropagateNan.ALL)
            alpha = tl.where(m_new == -float('inf'), 1.0, tl.exp(m - m_new))
            s = s * alpha + tl.where(x == -float('inf'), 0.0, tl.exp(x - m_new))
            m = m_new
    if CHUNK_MAX:
        mx = m_s
        total = s_s
    else:
        mx = tl.max(m, axis=0)
        total = tl.sum(tl.where(m == -float('inf'), 0.0, s * tl.exp(m - mx)), axis=0)
    n_chunks = tl.cdiv(n_cols, BLOCK)
    for i in tl.range(0, n_chunks, num_stages=STAGES):
        # TAIL: the write sweep starts at the row's end, which the first sweep read last and L2 still holds.
        if TAIL:
            c = (n_chunks - 1 - i) * BLOCK + cols
        else:
            c = i * BLOCK + cols
        cm = c < n_cols
        x = tl.load(x_ptr + row * sx + c, mask=cm, other=0.0, eviction_policy=DROP).to(tl.float32)
        if LOG:
            y = x - mx - tl.log(total)
        else:
            y = tl.exp(x - mx) / total
        tl.store(out_ptr + row * so + c, y.to(out_ptr.dtype.element_ty), mask=cm, eviction_policy=DROP)
'''


def _softmax_node(fm: FamilyMatch) -> tuple[str, bool, str]:
    g = fm.graph
    nodes = [n for n in g.compute_nodes()]
    sm = [n for n in nodes if n.op in ("_softmax", "_log_softmax")]
    if len(sm) != 1 or len(nodes) != 1 or len(g.outputs) != 1:
        raise TemplateError("not a single softmax over a problem input")
    n = sm[0]
    src = n.args[0]
    if not isinstance(src, Ref) or not src.name.startswith("p") or g.outputs[0] != Ref(n.name):
        raise TemplateError("softmax input must be a problem input and its output the result")
    return src.name, n.op == "_log_softmax", n.type.dtype if n.type else "float32"


class SoftmaxLoopTemplate(Template):
    name = "softmax_online"
    families = ("softmax", "log_softmax")

    def applicable(self, fm: FamilyMatch) -> bool:
        if fm.family not in self.families:
            return False
        if not fm.rows_are_last_dim:
            return False  # its rows are the last dim; the row-wise template strides over others
        try:
            _softmax_node(fm)
        except TemplateError:
            return False
        return True

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["online", "online_tail"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        return {"BLOCK": [512, 1024, 2048, 4096, 8192, 16384], "num_warps": [2, 4, 8, 16, 32],
                "num_stages": [1, 2, 3, 4], "CHUNK_MAX": [0, 1], "L2HINT": [0, 1]}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        return {"BLOCK": 8192, "num_warps": 8, "num_stages": 1, "CHUNK_MAX": 1, "L2HINT": 1}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        return elems_per_thread(params["BLOCK"], params["num_warps"]) <= MAX_ELEMS_PER_THREAD

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        x, log, out_dtype = _softmax_node(fm)
        hint = bool(params.get("L2HINT", 0))  # eviction policies; "" is Triton's default
        xe = fm.operand(x)
        body = [
            f"x = {xe}",
            "n_cols = x.shape[-1]",
            "x2 = x.reshape(-1, n_cols)",
            f"out = torch.empty(x2.shape, dtype={torch_dtype(out_dtype)}, device=x.device)",
            f"_softmax_online[(x2.shape[0],)](x2, out, n_cols, x2.stride(0), out.stride(0), "
            f"BLOCK={int(params['BLOCK'])}, LOG={log}, CHUNK_MAX={int(params.get('CHUNK_MAX', 0))}, "
            f"KEEP={'evict_last' if hint else ''!r}, DROP={'evict_first' if hint else ''!r}, "
            f"STAGES={int(params['num_stages'])}, TAIL={variant == 'online_tail'}, "
            f"num_warps={int(params['num_warps'])}, num_stages={int(params['num_stages'])})",
            "return out.view(x.shape)",
        ]
        return module_source(fm, "Chunked online softmax, rendered by kernelsmith.", _ONLINE_KERNEL, body)


# Before the whole-tensor reductions (70): a norm of a 1-D tensor is both.
register(Family("rowwise", priority=50, match=match, templates=(RowwiseTemplate(), SoftmaxLoopTemplate()),
                kinds=("rmsnorm", "layernorm", "softmax", "log_softmax", "rowwise"), kind=kind))
