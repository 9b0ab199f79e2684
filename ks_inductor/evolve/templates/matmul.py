"""mm / addmm / bmm with the pointwise epilogue fused: a tiled tl.dot GEMM with grouped (L2-friendly) tile order,
the bias and every pointwise op after the product applied to the fp32 accumulator before the one store.

Variants: one tile per program ("tiled"), or a persistent grid that walks tiles ("persistent").
"""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch, leaf_of
from ks_inductor.evolve.graph import Ref
from ks_inductor.evolve.pointwise import PointwiseUnsupported, Val, lower_chain, round_expr, store_expr
from ks_inductor.evolve.templates.base import (
    SM_COUNT_HELPER,
    Template,
    TemplateError,
    block_class,
    module_source,
    output_refs,
    torch_dtype,
    view_expr,
)


class MatmulTemplate(Template):
    name = "matmul"
    families = ("matmul",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["tiled", "persistent"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        s: dict[str, list[Any]] = {
            "BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
            "GROUP_M": [1, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5],
        }
        if variant == "persistent":
            s["WAVES"] = [1, 2]
        return s

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        mm = fm.graph.node(fm.attrs["mm"])
        shape = mm.type.shape if mm and mm.type else [128, 128]
        m, n = shape[-2], shape[-1]
        if device == "cpu" or m * n < 256 * 256:
            p: dict[str, Any] = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
                                 "num_stages": 2}
        else:
            p = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
        if variant == "persistent":
            p["WAVES"] = 1
        return p

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_M"] * params["BLOCK_N"] // 16)
        d["dot"] = True
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        a = fm.attrs
        mm = g.node(a["mm"])
        assert mm is not None and mm.type is not None
        out_name = output_refs(g)[0]
        out_t = g.type_of(out_name)
        batched = a["batched"]
        nd = 3 if batched else 2
        in_dtype = g.type_of(leaf_of(g, a["a"])[0]).dtype  # type: ignore[index,union-attr]
        # Epilogue operands: every value the epilogue reads besides the product itself.
        epi = [g.node(n) for n in a["epilogue"]]
        extras: dict[str, tuple[str, list]] = {}
        if a["bias"] is not None:
            lb = leaf_of(g, a["bias"])
            if lb is None:
                raise TemplateError("addmm bias must be an input or parameter")
            extras[a["bias"].name] = lb
        for n in epi:
            for r in n.refs():
                if r == mm.name or r in a["epilogue"]:
                    continue
                leaf = leaf_of(g, Ref(r))
                if leaf is None:
                    raise TemplateError(f"epilogue reads {r}, which is neither an input nor pointwise")
                extras[r] = leaf
        names = list(extras)
        env: dict[str, Val] = {r: Val(f"e{i}") for i, r in enumerate(names)}
        mm_t = mm.type
        acc = "acc"
        if a["bias"] is not None:
            acc = f"acc + {env[a['bias'].name].expr}"
        rnd = round_expr(f"({acc})", mm_t.dtype)
        env[mm.name] = Val("x_mm")
        try:
            epi_lines = lower_chain(epi, env)  # type: ignore[arg-type]
        except PointwiseUnsupported as e:
            raise TemplateError(str(e)) from None
        result = env[out_name].expr
        prec = ', input_precision="ieee"' if in_dtype in ("float32", "float64") else ""
        persistent = variant == "persistent"

        sig = ("a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, "
               "stride_cb, stride_cm, stride_cn")
        for i in range(len(names)):
            sig += f", e{i}_ptr, e{i}_sb, e{i}_sm, e{i}_sn"
        k = ["@triton.jit",
             f"def _matmul_kernel({sig}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, "
             "GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):",
             "    bid = tl.program_id(1)",
             "    num_pid_m = tl.cdiv(M, BLOCK_M)",
             "    num_pid_n = tl.cdiv(N, BLOCK_N)",
             "    num_tiles = num_pid_m * num_pid_n",
             "    num_pid_in_group = GROUP_M * num_pid_n"]
        ind = "    "
        if persistent:
            k.append("    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):")
            ind = "        "
            pid = "tile"
        else:
            pid = "tl.program_id(0)"
        k += [ind + f"pid = {pid}",
              ind + "group_id = pid // num_pid_in_group",
              ind + "first_pid_m = group_id * GROUP_M",
              ind + "group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
              ind + "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
              ind + "pid_n = (pid % num_pid_in_group) // group_size_m",
              ind + "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
              ind + "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
              ind + "offs_am = offs_m % M",
              ind + "offs_bn = offs_n % N",
              ind + "offs_k = tl.arange(0, BLOCK_K)",
              ind + "a_ptrs = a_ptr + bid * stride_ab + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak",
              ind + "b_ptrs = b_ptr + bid * stride_bb + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
              ind + "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
              ind + "for kk in range(0, tl.cdiv(K, BLOCK_K)):",
              ind + "    if EVEN_K:",
              ind + "        a = tl.load(a_ptrs)",
              ind + "        b = tl.load(b_ptrs)",
              ind + "    else:",
              ind + "        k_rem = K - kk * BLOCK_K",
              ind + "        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)",
              ind + "        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)",
              ind + (f"    acc = tl.dot(a, b, acc{prec})" if fm.target != "cpu" or in_dtype in ("float32", "float64")
                     else "    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=\"ieee\")"),
              ind + "    a_ptrs += BLOCK_K * stride_ak",
              ind + "    b_ptrs += BLOCK_K * stride_bk",
              ind + "cmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"]
        for i in range(len(names)):
            k.append(ind + f"e{i} = tl.load(e{i}_ptr + bid * e{i}_sb + offs_m[:, None] * e{i}_sm + "
                     f"offs_n[None, :] * e{i}_sn, mask=cmask, other=0.0).to(tl.float32)")
        k.append(ind + f"x_mm = {rnd}")
        k += [ind + ln for ln in epi_lines]
        k.append(ind + "c_ptrs = c_ptr + bid * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn")
        k.append(ind + f"tl.store(c_ptrs, {store_expr(result, out_t.dtype)}, mask=cmask)")  # type: ignore[union-attr]
        kernel = "\n".join(k)

        la, lb = leaf_of(g, a["a"]), leaf_of(g, a["b"])
        f = [f"a = {view_expr(fm, g, la)}", f"b = {view_expr(fm, g, lb)}"]  # type: ignore[arg-type]
        if batched:
            f += ["B, M, K = a.shape", "N = b.shape[2]",
                  f"c = torch.empty((B, M, N), dtype={torch_dtype(out_t.dtype)}, device=a.device)",  # type: ignore[union-attr]
                  "sa, sb_, sc = a.stride(), b.stride(), c.stride()"]
        else:
            f += ["M, K = a.shape", "N = b.shape[1]", "B = 1",
                  f"c = torch.empty((M, N), dtype={torch_dtype(out_t.dtype)}, device=a.device)",  # type: ignore[union-attr]
                  "sa, sb_, sc = (0,) + tuple(a.stride()), (0,) + tuple(b.stride()), (0,) + tuple(c.stride())"]
        extra_args = ""
        for i, r in enumerate(names):
            f.append(f"e{i} = {view_expr(fm, g, extras[r])}.expand(c.shape)")
            f.append(f"se{i} = tuple(e{i}.stride())" if nd == 3 else f"se{i} = (0,) + tuple(e{i}.stride())")
            extra_args += f", e{i}, se{i}[0], se{i}[1], se{i}[2]"
        bm, bn, bk = int(params["BLOCK_M"]), int(params["BLOCK_N"]), int(params["BLOCK_K"])
        f.append(f"tiles = triton.cdiv(M, {bm}) * triton.cdiv(N, {bn})")
        if persistent:
            f.append(f"grid = (max(1, min(tiles, _sm_count(a) * {int(params['WAVES'])})), B)")
        else:
            f.append("grid = (tiles, B)")
        f.append(f"_matmul_kernel[grid](a, b, c, M, N, K, sa[0], sa[1], sa[2], sb_[0], sb_[1], sb_[2], sc[0], sc[1], "
                 f"sc[2]{extra_args}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, GROUP_M={int(params['GROUP_M'])}, "
                 f"EVEN_K=(K % {bk} == 0), num_warps={int(params['num_warps'])}, "
                 f"num_stages={int(params['num_stages'])})")
        f.append("return c")
        return module_source(fm, f"{mm.op} with fused epilogue ({variant}), rendered by kernelsmith.", kernel, f,
                             SM_COUNT_HELPER if persistent else "")
