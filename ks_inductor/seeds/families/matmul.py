"""mm / addmm / bmm with the pointwise epilogue fused: a tiled tl.dot GEMM with grouped (L2-friendly) tile order,
the bias and every pointwise op after the product applied to the fp32 accumulator before the one store.

Variants:

- ``tiled``: one output tile per program.
- ``persistent``: a grid of SM-count programs walking the tiles.
- ``tma``: a persistent grid whose operand tiles come through host-built tensor descriptors (TMA on Hopper), so
  the copy engine, not the threads, moves them, with an optional warp-specialized K loop (``WS``). The
  descriptors read either layout of each operand (a Linear's transposed weight included); rows past the edge and
  the K tail come back as zeros. ``FLAT`` flattens the tile and K loops into one for the software pipeliner, so
  the next tile's operand loads are in flight while this tile's epilogue runs.
- ``splitk`` (skinny products only, as in decode): the K loop is cut into ``SPLIT_K`` slices run by separate
  programs, each writing an fp32 partial; a second kernel sums the partials and applies the epilogue. With 16
  rows and 4096 columns a tiled grid has 64 programs for 132 SMs, too few to keep the weight stream at full
  bandwidth.

The epilogue runs in the product's (M, N) frame. Reshapes after the product (a Linear on 3-D input is a 2-D mm
between views) keep its row-major order, so they are aliases there; every other operand is expanded to the shape
of the value it meets and read through its strides. A bmm whose right operand is one matrix broadcast over the
batch is run as a single GEMM of ``batch x M`` rows, so the matrix is read once instead of once per batch.
"""

from __future__ import annotations

import re
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import leaf_of
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    ITEMSIZE,
    SM_COUNT_HELPER,
    SMEM_BYTES,
    Template,
    TemplateError,
    block_class,
    module_source,
    output_refs,
    rounding_default,
    rounding_space,
    torch_dtype,
    view_expr,
)
from ks_inductor.seeds.graph import VIEW_OPS, Graph, Ref
from ks_inductor.seeds.pointwise import (
    PointwiseUnsupported,
    Val,
    is_pointwise,
    lower_chain,
    round_expr,
    store_expr,
)

MATMUL_OPS = ("mm", "addmm", "bmm")


def match(graph: Graph) -> dict[str, Any] | None:
    """One mm, addmm or bmm of two placeholders (read through transposes and reshapes) with pointwise work after
    it, reshaped afterwards only in ways that keep the product's row-major order."""
    mms = [n for n in graph.nodes if n.op in MATMUL_OPS]
    if len(mms) != 1:
        return None
    mm = mms[0]
    if mm.op == "addmm":
        bias, a, b = mm.args[:3]
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
            return None
    else:
        bias, (a, b) = None, mm.args[:2]
    la, lb = leaf_of(graph, a), leaf_of(graph, b)
    if la is None or lb is None:
        return None
    for leaf in (la, lb):
        if any(v.op not in ("permute", "t", "transpose", "view", "_unsafe_view", "unsqueeze", "expand")
               for v in leaf[1]):
            return None
    rest = [n for n in graph.compute_nodes() if n is not mm]
    if not all(is_pointwise(n) for n in rest):
        return None
    if len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref):
        return None
    out_t = graph.type_of(graph.outputs[0].name)
    mm_t = mm.type
    if out_t is None or mm_t is None:
        return None
    # Reshapes after the product (a Linear on 3-D input is mm between two views) keep the row-major order of
    # the (M, N) tile, so the epilogue runs in the product's frame; other views of the product would not.
    down = {mm.name}
    views: list[str] = []
    for n in graph.nodes:
        refs = set(n.refs())
        if not refs & down:
            continue
        if n.op in VIEW_OPS:
            if n.op not in ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze"):
                return None
            views.append(n.name)
        down.add(n.name)
    if graph.outputs[0].name not in down:
        return None
    for name in down:
        t = graph.type_of(name)
        if t is None or t.numel != mm_t.numel or not t.shape or t.shape[-1] != mm_t.shape[-1]:
            return None
    if mm.op == "bmm" and out_t.shape != mm_t.shape:
        return None
    return {"mm": mm.name, "a": a, "b": b, "bias": bias, "epilogue": [n.name for n in rest],
            "views": views, "downstream": sorted(down), "batched": mm.op == "bmm"}


SKINNY_ROWS = 512  # products with at most this many rows also get the split-K variant
TMA_IMPORT = "from triton.tools.tensor_descriptor import TensorDescriptor\n"
# Kernel lines both GEMM kernels share: the tile grid of batch ``bid``, and tile ``pid`` -> (pid_m, pid_n) in groups
# of GROUP_M row tiles, so programs running together reuse the same columns of b from L2.
_GRID = ["bid = tl.program_id(1)", "num_pid_m = tl.cdiv(M, BLOCK_M)", "num_pid_n = tl.cdiv(N, BLOCK_N)",
         "num_tiles = num_pid_m * num_pid_n", "num_pid_in_group = GROUP_M * num_pid_n", "k_tiles = tl.cdiv(K, BLOCK_K)"]
_GROUPED_TILE = ["group_id = pid // num_pid_in_group", "first_pid_m = group_id * GROUP_M",
                 "group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
                 "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
                 "pid_n = (pid % num_pid_in_group) // group_size_m"]


def _rows_cols(fm: FamilyMatch) -> tuple[int, int]:
    """Rows (batch included) and columns of the product."""
    t = fm.graph.type_of(fm.attrs["mm"])
    assert t is not None
    return t.numel // t.shape[-1], t.shape[-1]


class MatmulTemplate(Template):
    name = "matmul"
    families = ("matmul",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        rows, _ = _rows_cols(fm)
        tma = ["tma"] if _tma_ok(fm) else []
        return ["tiled", "persistent"] + tma + (["splitk"] if rows <= SKINNY_ROWS else [])

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        s: dict[str, list[Any]] = {
            "BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128, 256],
            "GROUP_M": [1, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5, 6],
        }
        if variant in ("persistent", "tma"):
            s["WAVES"] = [1, 2]
        if variant == "tma":
            s["WS"] = [0, 1]
            s["FLAT"] = [0, 1]
        if variant == "splitk":
            s["SPLIT_K"] = [2, 3, 4, 6, 8, 12, 16]
        return {**s, **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        m, n = _rows_cols(fm)
        if device == "cpu" or m * n < 256 * 256:
            p: dict[str, Any] = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
                                 "num_stages": 2}
        elif m <= 64:
            # A weight stream: thin row tiles, deep K tiles and a deep pipeline keep bytes in flight.
            p = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
        else:
            p = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
        if variant in ("persistent", "tma"):
            p["WAVES"] = 1
        if variant == "tma":
            # Warp specialization stays a search choice: on the H200, timed interleaved with the peers, a
            # 4096x4096x14336 GEMM + GELU took 706.7 us with it and 709.2 without, and it compiled about three
            # times slower (benchmarks/results/timing-context-nvidia-h200-2026-11-22.json).
            p["WS"] = 0
            # On the H200, timed interleaved with the peers (per call, L2 flushed), the 4096x4096x14336 GEMM + GELU
            # took 675.6 us flattened and 694.3 us nested; Inductor took 691.7. Splitting the epilogue into column
            # halves (704.3) or storing through a descriptor (727.8) lost
            # (docs/findings.md, "GEMM + GELU").
            p["FLAT"] = 1
        if variant == "splitk":
            tiles = -(-m // p["BLOCK_M"]) * -(-n // p["BLOCK_N"])
            want = -(-264 // max(tiles, 1))  # about two programs per SM of an H100/H200
            p["SPLIT_K"] = min((s for s in self.space(fm, variant)["SPLIT_K"] if s >= want), default=16)
        return {**p, **rounding_default(fm)}

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        la = leaf_of(fm.graph, fm.attrs["a"])
        item = ITEMSIZE.get(fm.graph.type_of(la[0]).dtype, 4) if la else 4  # type: ignore[union-attr]
        bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
        if (bm + bn) * bk * item * max(1, params["num_stages"] - 1) > SMEM_BYTES:
            return False
        if params.get("FLAT") and params.get("WS"):
            return False  # the warp-specialized K loop is nested; flattening it away leaves nothing to specialize
        return bm * bn // (32 * params["num_warps"]) <= 128  # fp32 accumulator registers per thread

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_M"] * params["BLOCK_N"] // 16)
        d["dot"] = True
        return d

    # ------------------------------------------------------------------------------------------ rendering

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        a = fm.attrs
        mm = g.node(a["mm"])
        assert mm is not None and mm.type is not None
        out_name = output_refs(g)[0]
        out_t = g.type_of(out_name)
        assert out_t is not None
        la, lb = leaf_of(g, a["a"]), leaf_of(g, a["b"])
        in_dtype = g.type_of(la[0]).dtype  # type: ignore[index,union-attr]
        extras, frames = _epilogue_operands(g, a)
        names = list(extras)
        epilogue = _epilogue_lines(g, a, names, out_name, out_t.dtype)
        prec = ', input_precision="ieee"' if in_dtype in ("float32", "float64") else ""
        dot = (f"acc = tl.dot(a, b, acc{prec})" if fm.target != "cpu" or in_dtype in ("float32", "float64")
               else 'acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")')
        split = variant == "splitk"
        persistent = variant == "persistent"

        esig = "".join(f", e{i}_ptr, e{i}_sb, e{i}_sm, e{i}_sn" for i in range(len(names)))
        if variant == "tma":
            kernel = _tma_kernel(esig, dot, epilogue, batched=a["batched"], flat=bool(params.get("FLAT")))
        else:
            kernel = _pointer_kernels(esig, dot, epilogue, split, persistent)

        f = [f"a = {view_expr(fm, g, la)}", f"b = {view_expr(fm, g, lb)}"]  # type: ignore[arg-type]
        if not a["batched"]:
            f += ["a, b = a.unsqueeze(0), b.unsqueeze(0)"]
        f += ["B, M, K = a.shape", "N = b.shape[2]",
              "if B > 1 and b.stride(0) == 0:",
              "    # one matrix for every batch: one GEMM of B*M rows reads it once",
              "    a, b, M, B = a.reshape(1, B * M, K), b[:1], B * M, 1",
              f"c = torch.empty((B, M, N), dtype={torch_dtype(out_t.dtype)}, device=a.device)"]
        eargs = ""
        for i, r in enumerate(names):
            f.append(f"e{i} = {view_expr(fm, g, extras[r])}.expand({frames[r]!r}).reshape(B, M, N)")
            f.append(f"se{i} = e{i}.stride()")
            eargs += f", e{i}, se{i}[0], se{i}[1], se{i}[2]"
        bm, bn, bk = int(params["BLOCK_M"]), int(params["BLOCK_N"]), int(params["BLOCK_K"])
        launch = (f"BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={int(params['GROUP_M'])}, "
                  f"EVEN_K=(K % {bk} == 0), num_warps={int(params['num_warps'])}, "
                  f"num_stages={int(params['num_stages'])}")
        strides = ("a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2), "
                   "c.stride(0), c.stride(1), c.stride(2)")
        f.append(f"tiles = triton.cdiv(M, {bm}) * triton.cdiv(N, {bn})")
        if split:
            sk = int(params["SPLIT_K"])
            f += [f"ws = torch.empty(({sk}, B, M, N), dtype=torch.float32, device=a.device)",
                  f"_matmul_partial[(tiles, B, {sk})](a, b, ws, M, N, K, {strides}, SPLIT_K={sk}, {launch})",
                  f"_matmul_epilogue[(tiles, B)](ws, c, M, N, c.stride(0), c.stride(1), c.stride(2){eargs}, "
                  f"SPLIT_K={sk}, BLOCK_M={bm}, BLOCK_N={bn}, num_warps={min(4, int(params['num_warps']))})"]
        elif variant == "tma":
            lead, pick = ("1, ", "") if a["batched"] else ("", "[0]")
            f += ["a_t, b_t = a.stride(2) != 1, b.stride(2) != 1",
                  f"a_desc = TensorDescriptor.from_tensor((a.transpose(1, 2) if a_t else a){pick}, "
                  f"[{lead}{bk}, {bm}] if a_t else [{lead}{bm}, {bk}])",
                  f"b_desc = TensorDescriptor.from_tensor((b.transpose(1, 2) if b_t else b){pick}, "
                  f"[{lead}{bn}, {bk}] if b_t else [{lead}{bk}, {bn}])",
                  f"grid = (max(1, min(tiles, _sm_count(a) * {int(params['WAVES'])})), B)",
                  f"_matmul_kernel[grid](a_desc, b_desc, c, M, N, K, c.stride(0), c.stride(1), c.stride(2){eargs}, "
                  f"BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={int(params['GROUP_M'])}, A_T=a_t, B_T=b_t, "
                  f"WS={bool(params['WS'])}, num_warps={int(params['num_warps'])}, "
                  f"num_stages={int(params['num_stages'])})"]
        else:
            grid = (f"(max(1, min(tiles, _sm_count(a) * {int(params['WAVES'])})), B)" if persistent
                    else "(tiles, B)")
            f.append(f"_matmul_kernel[{grid}](a, b, c, M, N, K, {strides}{eargs}, {launch})")
        f.append(f"return c.view({list(out_t.shape)!r})")
        helpers = "\n".join(
            ([TMA_IMPORT] if variant == "tma" else []) + ([SM_COUNT_HELPER] if variant in ("persistent", "tma") else []))
        return module_source(fm, f"{mm.op} with fused epilogue ({variant}), rendered by kernelsmith.", kernel, f,
                             helpers, params)


def _tma_ok(fm: FamilyMatch) -> bool:
    """Tensor descriptors need each row of an operand to start 16-byte aligned: K and N elements for the usual
    layouts (a row-major, b either way). A transposed left operand is checked by the descriptor at run time."""
    g = fm.graph
    ta, tb = g.type_of(fm.attrs["a"].name), g.type_of(fm.attrs["b"].name)
    if ta is None or tb is None:
        return False
    return all(d * ITEMSIZE.get(t.dtype, 4) % 16 == 0 for d in (ta.shape[-1], tb.shape[-1]) for t in (ta, tb))


def _tma_kernel(esig: str, dot: str, epilogue: list[str], batched: bool, flat: bool = False) -> str:
    """The persistent GEMM that reads its operand tiles through tensor descriptors. ``A_T``/``B_T`` say the
    descriptor covers the operand's transpose (its contiguous layout); batched products use rank-3 descriptors
    whose leading block dimension is one batch. ``flat`` is the template's FLAT."""

    def load(desc: str, first: str, second: str, d0: str, d1: str, flip: str) -> list[str]:
        at = ("[bid, {}, {}]" if batched else "[{}, {}]")
        shape = ".reshape({}, {})" if batched else ""
        return [f"        if {flip}:",
                f"            {desc[0]} = {desc}.load({at.format(second, first)}){shape.format(d1, d0)}.T",
                "        else:",
                f"            {desc[0]} = {desc}.load({at.format(first, second)}){shape.format(d0, d1)}"]

    flatten = ", flatten=True" if flat else ""
    k = ["@triton.jit",
         f"def _matmul_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cb, stride_cm, stride_cn{esig}, "
         "BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, "
         "A_T: tl.constexpr, B_T: tl.constexpr, WS: tl.constexpr):",
         *["    " + ln for ln in _GRID]]
    if flat:
        # The epilogue finds its tile from a counter of its own, as Triton's persistent-matmul tutorial does: the
        # flattening pipeliner cannot carry one value into both the next tile's loads and this tile's epilogue.
        k.append("    tile_c = tl.program_id(0) - tl.num_programs(0)")
    k += [f"    for pid in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0){flatten}):",
          *["        " + ln for ln in _GROUPED_TILE],
          "        off_m = pid_m * BLOCK_M",
          "        off_n = pid_n * BLOCK_N",
          "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
          "        for kk in tl.range(0, k_tiles, warp_specialize=WS):",
          "            off_k = kk * BLOCK_K"]
    k += ["    " + ln for ln in load("a_desc", "off_m", "off_k", "BLOCK_M", "BLOCK_K", "A_T")]
    k += ["    " + ln for ln in load("b_desc", "off_k", "off_n", "BLOCK_K", "BLOCK_N", "B_T")]
    k.append("            " + dot)
    if flat:
        k.append("        tile_c += tl.num_programs(0)")
        k += ["        " + re.sub(r"\bpid\b", "tile_c", ln) for ln in _GROUPED_TILE]
        k += ["        off_m = pid_m * BLOCK_M", "        off_n = pid_n * BLOCK_N"]
    k += ["        offs_m = off_m + tl.arange(0, BLOCK_M)",
          "        offs_n = off_n + tl.arange(0, BLOCK_N)",
          "        cmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"]
    k += ["        " + ln for ln in epilogue]
    return "\n".join(k)


def _pointer_kernels(esig: str, dot: str, epilogue: list[str], split: bool, persistent: bool) -> str:
    """The pointer-addressed GEMM kernels (tiled, persistent, split-K partial and epilogue)."""
    sig = ("a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, "
           "stride_cb, stride_cm, stride_cn")
    consts = "BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr"
    k: list[str] = []
    if split:
        k += ["@triton.jit",
              f"def _matmul_partial({sig}, SPLIT_K: tl.constexpr, {consts}, EVEN_K: tl.constexpr):"]
    else:
        k += ["@triton.jit", f"def _matmul_kernel({sig}{esig}, {consts}, EVEN_K: tl.constexpr):"]
    k += ["    " + ln for ln in _GRID]
    if split:
        k += ["    per_split = tl.cdiv(k_tiles, SPLIT_K)",
              "    k_first = tl.program_id(2) * per_split",
              "    k_last = tl.minimum(k_first + per_split, k_tiles)"]
    else:
        k += ["    k_first = 0", "    k_last = k_tiles"]
    ind = "    "
    if persistent:
        k.append("    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):")
        ind = "        "
        pid = "tile"
    else:
        pid = "tl.program_id(0)"
    k += [ind + f"pid = {pid}", *[ind + ln for ln in _GROUPED_TILE],
          ind + "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
          ind + "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
          ind + "offs_am = offs_m % M",
          ind + "offs_bn = offs_n % N",
          ind + "offs_k = k_first * BLOCK_K + tl.arange(0, BLOCK_K)",
          ind + "a_ptrs = a_ptr + bid * stride_ab + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak",
          ind + "b_ptrs = b_ptr + bid * stride_bb + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
          ind + "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
          ind + "for kk in range(k_first, k_last):",
          ind + "    if EVEN_K:",
          ind + "        a = tl.load(a_ptrs)",
          ind + "        b = tl.load(b_ptrs)",
          ind + "    else:",
          ind + "        k_rem = K - kk * BLOCK_K",
          ind + "        a = tl.load(a_ptrs, mask=offs_k[None, :] - k_first * BLOCK_K < k_rem, other=0.0)",
          ind + "        b = tl.load(b_ptrs, mask=offs_k[:, None] - k_first * BLOCK_K < k_rem, other=0.0)",
          ind + "    " + dot,
          ind + "    a_ptrs += BLOCK_K * stride_ak",
          ind + "    b_ptrs += BLOCK_K * stride_bk",
          ind + "cmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"]
    if split:
        # The partial goes to ws[split, batch, m, n] (contiguous, fp32); c_ptr is the workspace here.
        k.append(ind + "w_ptrs = c_ptr + (tl.program_id(2) * tl.num_programs(1) + bid) * M * N + "
                 "offs_m[:, None] * N + offs_n[None, :]")
        k.append(ind + "tl.store(w_ptrs, acc, mask=cmask)")
        k += ["", "", "@triton.jit",
              f"def _matmul_epilogue(w_ptr, c_ptr, M, N, stride_cb, stride_cm, stride_cn{esig}, "
              "SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):",
              "    bid = tl.program_id(1)",
              "    num_pid_n = tl.cdiv(N, BLOCK_N)",
              "    pid_m = tl.program_id(0) // num_pid_n",
              "    pid_n = tl.program_id(0) % num_pid_n",
              "    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
              "    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
              "    cmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
              "    w_ptrs = w_ptr + bid * M * N + offs_m[:, None] * N + offs_n[None, :]",
              "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
              "    for s in range(SPLIT_K):",
              "        acc += tl.load(w_ptrs + s * tl.num_programs(1) * M * N, mask=cmask, other=0.0)"]
        k += ["    " + ln for ln in epilogue]
    else:
        k += [ind + ln for ln in epilogue]
    return "\n".join(k)


def _epilogue_operands(g: Graph, a: dict[str, Any]) -> tuple[dict[str, tuple[str, list]], dict[str, list[int]]]:
    """Every value the epilogue reads besides the product (an input or parameter behind views), and the shape
    each is expanded to: that of the downstream value it meets."""
    mm = g.node(a["mm"])
    assert mm is not None and mm.type is not None
    down = set(a["downstream"])
    epi = set(a["epilogue"])
    extras: dict[str, tuple[str, list]] = {}
    frames: dict[str, list[int]] = {}

    def take(r: str, shape: list[int]) -> None:
        if r in down:
            return
        if r in frames:
            t = g.type_of(r)
            row_vector = t is not None and all(s == 1 for s in t.shape[:-1])
            if frames[r] != list(shape) and not row_vector:
                # expanded to two different shapes, one operand could map to two different tiles
                raise TemplateError(f"epilogue reads {r} at shapes {frames[r]} and {list(shape)}")
            return
        if r in epi:  # pointwise work on operands alone (a scaled bias): its operands meet the same value
            node = g.node(r)
            for rr in node.refs():  # type: ignore[union-attr]
                take(rr, shape)
            return
        leaf = leaf_of(g, Ref(r))
        if leaf is None:
            raise TemplateError(f"epilogue reads {r}, which is neither an input nor pointwise")
        extras[r] = leaf
        frames[r] = list(shape)

    if a["bias"] is not None:
        if leaf_of(g, a["bias"]) is None:
            raise TemplateError("addmm bias must be an input or parameter")
        take(a["bias"].name, list(mm.type.shape))
    for n in g.nodes:
        if n.name in down and n.name != mm.name and n.type is not None:
            for r in n.refs():
                take(r, list(n.type.shape))
    return extras, frames


def _epilogue_lines(g: Graph, a: dict[str, Any], names: list[str], out_name: str, out_dtype: str) -> list[str]:
    """Kernel lines (unindented) from the fp32 ``acc`` tile to the store of the output tile."""
    mm = g.node(a["mm"])
    assert mm is not None and mm.type is not None
    lines = [f"e{i} = tl.load(e{i}_ptr + bid * e{i}_sb + offs_m[:, None] * e{i}_sm + offs_n[None, :] * e{i}_sn, "
             "mask=cmask, other=0.0).to(tl.float32)" for i in range(len(names))]
    env: dict[str, Val] = {r: Val(f"e{i}") for i, r in enumerate(names)}
    acc = "acc" if a["bias"] is None else f"acc + {env[a['bias'].name].expr}"
    lines.append(f"x_mm = {round_expr(f'({acc})', mm.type.dtype)}")
    env[mm.name] = Val("x_mm")
    views = set(a["views"])
    epi = set(a["epilogue"])
    try:
        for n in g.nodes:
            if n.name in views:
                env[n.name] = env[n.args[0].name]  # a reshape of the tile is the tile
            elif n.name in epi:
                lines += lower_chain([n], env)
    except PointwiseUnsupported as e:
        raise TemplateError(str(e)) from None
    lines.append("c_ptrs = c_ptr + bid * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn")
    lines.append(f"tl.store(c_ptrs, {store_expr(env[out_name].expr, out_dtype)}, mask=cmask)")
    return lines


register(Family("matmul", priority=10, match=match, templates=(MatmulTemplate(),)))
