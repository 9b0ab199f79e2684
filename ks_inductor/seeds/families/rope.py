"""Rotary position embedding (rotate-half form) on one or more head tensors sharing cos/sin.

A program takes a block of positions of one batch entry, loads the cos/sin rows once and walks every head of
every rotated tensor, so cos/sin traffic is paid once rather than per head. Variants: all tensors in one launch
("fused"), or one launch per tensor ("separate").

NATIVE=1 computes in the tensors' own 16-bit dtype with the packed half-precision instructions, where x, cos, sin
and the output share it: each product and the sum are then rounded once, as eager rounds each op, provided the
compiler does not contract a product into the add (the launch turns FP fusion off). Widened to fp32 with the
roundings emulated, the kernel issues about three times the instructions per element, and RoPE moves so few
bytes per element that the instruction stream, not DRAM, set its pace on the H200.
"""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import rope_of
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    Template,
    TemplateError,
    block_class,
    module_source,
    rounding_default,
    rounding_space,
    torch_dtype,
)
from ks_inductor.seeds.graph import Graph
from ks_inductor.seeds.pointwise import round_expr, store_expr


def match(graph: Graph) -> dict[str, Any] | None:
    """Nothing but cat, neg, mul and add, every output ``x * cos + rotate_half(x) * sin``."""
    ops = set(graph.ops())
    if not ({"cat", "neg", "mul", "add"} <= ops and ops <= {"cat", "neg", "mul", "add"}):
        return None
    outs = []
    for o in graph.outputs:
        r = rope_of(graph, o)
        if r is None:
            return None
        outs.append({"x": r["x_leaf"][0], "cos": r["cos_leaf"][0], "sin": r["sin_leaf"][0], "out": o.name})
    return {"outputs": outs}


_NATIVE_DTYPES = ("bfloat16", "float16")


def _native_offered(fm: FamilyMatch) -> bool:
    """NATIVE needs a GPU target (the interpreter has no 16-bit arithmetic of its own) and one 16-bit dtype for
    every rotated tensor, cos, sin and output, so that eager's type promotion computes each op in that dtype."""
    if fm.target == "cpu":
        return False
    g = fm.graph
    names = [n for o in fm.attrs["outputs"] for n in (o["x"], o["cos"], o["sin"], o["out"])]
    dts = {t.dtype if t is not None else None for t in map(g.type_of, names)}
    return len(dts) == 1 and dts <= set(_NATIVE_DTYPES)


class RopeTemplate(Template):
    name = "rope"
    families = ("rope",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["fused", "separate"] if len(fm.attrs["outputs"]) > 1 else ["fused"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        # HTILE=1 loads the HB heads as one [HB, BLOCK_T, D/2] tile (more bytes in flight per program);
        # HTILE=0 walks them one after another.
        s = {"BLOCK_T": [1, 2, 4, 8, 16, 32, 64], "HB": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8, 16],
             "num_stages": [1, 2, 3], "HTILE": [0, 1], "EVICT": [0, 1], **rounding_space(fm)}
        if _native_offered(fm):
            s["NATIVE"] = [0, 1]
        return s

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        p = {"BLOCK_T": 16, "HB": 4, "num_warps": 4, "num_stages": 1, "HTILE": 0, "EVICT": 0,
             **rounding_default(fm)}
        if _native_offered(fm):
            p["NATIVE"] = 1
        return p

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_T"] * params["HB"] * 64)
        return d

    def _kernel(self, fm: FamilyMatch, group: list[int], htile: bool = False, native: bool = False,
                evict: bool = False) -> str:
        g = fm.graph
        outs = fm.attrs["outputs"]
        sig = ["cos_ptr", "sin_ptr", "T", "cs_b", "cs_t", "cs_d", "ss_b", "ss_t", "ss_d", "G_TOTAL"]
        for j in group:
            sig += [f"x{j}_ptr", f"o{j}_ptr", f"H{j}", f"G{j}_start", f"G{j}", f"x{j}_b", f"x{j}_h", f"x{j}_t",
                    f"x{j}_d", f"o{j}_b", f"o{j}_h", f"o{j}_t"]
        name = "_rope_kernel_" + "_".join(str(j) for j in group)
        widen = "" if native else ".to(tl.float32)"
        # EVICT: the heads are read and written once; cos/sin, read by every head group, keep the L2.
        ld = ', eviction_policy="evict_first"' if evict else ""
        st_hint = ', cache_modifier=".cs"' if evict else ""
        k = ["@triton.jit",
             f"def {name}({', '.join(sig)}, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, "
             "HB: tl.constexpr, EVEN: tl.constexpr):",
             "    pid1 = tl.program_id(1)",
             "    b = (pid1 // G_TOTAL).to(tl.int64)",
             "    grp = pid1 % G_TOTAL",
             "    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)",
             "    d = tl.arange(0, BLOCK_D)",
             # EVEN (the launch found no ragged edge): an all-true mask, which the compiler folds away.
             "    mask = tl.full([BLOCK_T, BLOCK_D], 1, tl.int1) if EVEN else (t[:, None] < T) & (d[None, :] < HALF)",
             "    t64 = t.to(tl.int64)[:, None]",
             "    c_off = cos_ptr + b * cs_b + t64 * cs_t",
             "    s_off = sin_ptr + b * ss_b + t64 * ss_t",
             f"    c1 = tl.load(c_off + d[None, :] * cs_d, mask=mask, other=0.0){widen}",
             f"    c2 = tl.load(c_off + (d[None, :] + HALF) * cs_d, mask=mask, other=0.0){widen}",
             f"    s1 = tl.load(s_off + d[None, :] * ss_d, mask=mask, other=0.0){widen}",
             f"    s2 = tl.load(s_off + (d[None, :] + HALF) * ss_d, mask=mask, other=0.0){widen}"]
        for j in group:
            ot = g.type_of(outs[j]["out"])
            dt = ot.dtype if ot is not None else "float32"

            def r(e: str, dt: str = dt) -> str:
                return f"({e})" if native else round_expr(f"({e})", dt)

            def st(e: str, dt: str = dt) -> str:
                return e if native else store_expr(e, dt)

            if htile:
                k += [f"    if (grp >= G{j}_start) & (grp < G{j}_start + G{j}):",
                      f"        h = ((grp - G{j}_start) * HB + tl.arange(0, HB)).to(tl.int64)",
                      f"        hm = mask[None, :, :] if EVEN else mask[None, :, :] & (h < H{j})[:, None, None]",
                      f"        xb = x{j}_ptr + b * x{j}_b + h[:, None, None] * x{j}_h + t64[None, :, :] * x{j}_t",
                      f"        ob = o{j}_ptr + b * o{j}_b + h[:, None, None] * o{j}_h + t64[None, :, :] * o{j}_t",
                      f"        xa = tl.load(xb + d[None, None, :] * x{j}_d, mask=hm, other=0.0{ld}){widen}",
                      f"        xc = tl.load(xb + (d[None, None, :] + HALF) * x{j}_d, mask=hm, other=0.0{ld}){widen}",
                      f"        ya = {r(r('xa * c1[None, :, :]') + ' + ' + r('(-xc) * s1[None, :, :]'))}",
                      f"        yc = {r(r('xc * c2[None, :, :]') + ' + ' + r('xa * s2[None, :, :]'))}",
                      f"        tl.store(ob + d[None, None, :], {st('ya')}, mask=hm{st_hint})",
                      f"        tl.store(ob + (d[None, None, :] + HALF), {st('yc')}, mask=hm{st_hint})"]
                continue
            k += [f"    if (grp >= G{j}_start) & (grp < G{j}_start + G{j}):",
                  "        for hh in range(HB):",
                  f"            h = (grp - G{j}_start) * HB + hh",
                  f"            hm = mask if EVEN else mask & ((t[:, None] * 0 + h) < H{j})",
                  f"            xb = x{j}_ptr + b * x{j}_b + h * x{j}_h + t64 * x{j}_t",
                  f"            ob = o{j}_ptr + b * o{j}_b + h * o{j}_h + t64 * o{j}_t",
                  f"            xa = tl.load(xb + d[None, :] * x{j}_d, mask=hm, other=0.0{ld}){widen}",
                  f"            xc = tl.load(xb + (d[None, :] + HALF) * x{j}_d, mask=hm, other=0.0{ld}){widen}",
                  f"            ya = {r(r('xa * c1') + ' + ' + r('(-xc) * s1'))}",
                  f"            yc = {r(r('xc * c2') + ' + ' + r('xa * s2'))}",
                  f"            tl.store(ob + d[None, :], {st('ya')}, mask=hm{st_hint})",
                  f"            tl.store(ob + (d[None, :] + HALF), {st('yc')}, mask=hm{st_hint})"]
        return "\n".join(k)

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        outs = fm.attrs["outputs"]
        groups = [list(range(len(outs)))] if variant == "fused" else [[j] for j in range(len(outs))]
        cs = {(o["cos"], o["sin"]) for o in outs}
        if len(cs) != 1:
            raise TemplateError("all rotated tensors must share cos and sin")
        htile = bool(params.get("HTILE", 0))
        native = bool(params.get("NATIVE", 0))
        evict = bool(params.get("EVICT", 0))
        kernels = "\n\n\n".join(self._kernel(fm, grp, htile, native, evict) for grp in groups)
        f: list[str] = []
        for j, o in enumerate(outs):
            nd = len(g.type_of(o["x"]).shape)  # type: ignore[union-attr]
            if nd not in (3, 4):
                raise TemplateError("rotated tensors must be [B, T, D] or [B, H, T, D]")
            f.append(f"x{j} = {fm.operand(o['x'])}" + (".unsqueeze(1)" if nd == 3 else ""))
            f.append(f"o{j} = torch.empty(x{j}.shape, dtype={torch_dtype(g.type_of(o['out']).dtype)}, "
                     f"device=x{j}.device)")
        # cos/sin as the HF convention lays them out: [T, D], [B, T, D] (unsqueezed at the head dim) or 4-D;
        # then broadcast over heads.
        for nm, ph in (("cos", outs[0]["cos"]), ("sin", outs[0]["sin"])):
            f.append(f"{nm} = {fm.operand(ph)}")
            f.append(f"{nm} = {nm}.unsqueeze(1) if {nm}.dim() == 3 else ({nm}.reshape(1, 1, *{nm}.shape) "
                     f"if {nm}.dim() == 2 else {nm})")
            f.append(f"{nm} = {nm}.expand(x0.shape[0], 1, x0.shape[2], x0.shape[3])")
        f += ["B, T, D = x0.shape[0], x0.shape[2], x0.shape[3]", "HALF = D // 2",
              "BLOCK_D = triton.next_power_of_2(HALF)", f"BLOCK_T = {int(params['BLOCK_T'])}",
              f"HB = {int(params['HB'])}"]
        for grp in groups:
            f.append("g_start = 0")
            for j in grp:
                f.append(f"g{j} = triton.cdiv(x{j}.shape[1], HB)")
                f.append(f"g{j}_start = g_start")
                f.append(f"g_start = g_start + g{j}")
            args = ["cos", "sin", "T", "cos.stride(0)", "cos.stride(2)", "cos.stride(3)", "sin.stride(0)",
                    "sin.stride(2)", "sin.stride(3)", "g_start"]
            for j in grp:
                args += [f"x{j}", f"o{j}", f"x{j}.shape[1]", f"g{j}_start", f"g{j}", f"x{j}.stride(0)",
                         f"x{j}.stride(1)", f"x{j}.stride(2)", f"x{j}.stride(3)", f"o{j}.stride(0)",
                         f"o{j}.stride(1)", f"o{j}.stride(2)"]
            name = "_rope_kernel_" + "_".join(str(j) for j in grp)
            even = " and ".join(["BLOCK_D == HALF", "T % BLOCK_T == 0"] + [f"x{j}.shape[1] % HB == 0" for j in grp])
            f.append(f"{name}[(triton.cdiv(T, BLOCK_T), B * g_start)]({', '.join(args)}, HALF=HALF, BLOCK_D=BLOCK_D, "
                     f"BLOCK_T=BLOCK_T, HB=HB, EVEN={even}, num_warps={int(params['num_warps'])}, "
                     f"num_stages={int(params['num_stages'])}" + (", enable_fp_fusion=False)" if native else ")"))
        rets = []
        for j, o in enumerate(outs):
            nd = len(g.type_of(o["x"]).shape)  # type: ignore[union-attr]
            rets.append(f"o{j}" if nd == 4 else f"o{j}.squeeze(1)")
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        return module_source(fm, f"Rotary embedding ({variant}), rendered by kernelsmith.", kernels, f, "", params)


register(Family("rope", priority=40, match=match, templates=(RopeTemplate(),)))
