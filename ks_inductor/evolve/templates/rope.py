"""Rotary position embedding (rotate-half form) on one or more head tensors sharing cos/sin.

A program takes a block of positions of one batch entry, loads the cos/sin rows once and walks every head of
every rotated tensor, so cos/sin traffic is paid once rather than per head. Variants: all tensors in one launch
("fused"), or one launch per tensor ("separate").
"""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.pointwise import round_expr, store_expr
from ks_inductor.evolve.templates.base import (
    Template,
    TemplateError,
    block_class,
    module_source,
    rounding_default,
    rounding_space,
    torch_dtype,
)


class RopeTemplate(Template):
    name = "rope"
    families = ("rope",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["fused", "separate"] if len(fm.attrs["outputs"]) > 1 else ["fused"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        # HTILE=1 loads the HB heads as one [HB, BLOCK_T, D/2] tile (more bytes in flight per program);
        # HTILE=0 walks them one after another.
        return {"BLOCK_T": [1, 2, 4, 8, 16, 32, 64], "HB": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8, 16],
                "num_stages": [1, 2, 3], "HTILE": [0, 1], **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        return {"BLOCK_T": 16, "HB": 4, "num_warps": 4, "num_stages": 1, "HTILE": 0,
                **rounding_default(fm)}

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_T"] * params["HB"] * 64)
        return d

    def _kernel(self, fm: FamilyMatch, group: list[int], htile: bool = False) -> str:
        g = fm.graph
        outs = fm.attrs["outputs"]
        sig = ["cos_ptr", "sin_ptr", "T", "cs_b", "cs_t", "cs_d", "ss_b", "ss_t", "ss_d", "G_TOTAL"]
        for j in group:
            sig += [f"x{j}_ptr", f"o{j}_ptr", f"H{j}", f"G{j}_start", f"G{j}", f"x{j}_b", f"x{j}_h", f"x{j}_t",
                    f"x{j}_d", f"o{j}_b", f"o{j}_h", f"o{j}_t"]
        name = "_rope_kernel_" + "_".join(str(j) for j in group)
        k = ["@triton.jit",
             f"def {name}({', '.join(sig)}, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, "
             "HB: tl.constexpr):",
             "    pid1 = tl.program_id(1)",
             "    b = (pid1 // G_TOTAL).to(tl.int64)",
             "    grp = pid1 % G_TOTAL",
             "    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)",
             "    d = tl.arange(0, BLOCK_D)",
             "    mask = (t[:, None] < T) & (d[None, :] < HALF)",
             "    t64 = t.to(tl.int64)[:, None]",
             "    c_off = cos_ptr + b * cs_b + t64 * cs_t",
             "    s_off = sin_ptr + b * ss_b + t64 * ss_t",
             "    c1 = tl.load(c_off + d[None, :] * cs_d, mask=mask, other=0.0).to(tl.float32)",
             "    c2 = tl.load(c_off + (d[None, :] + HALF) * cs_d, mask=mask, other=0.0).to(tl.float32)",
             "    s1 = tl.load(s_off + d[None, :] * ss_d, mask=mask, other=0.0).to(tl.float32)",
             "    s2 = tl.load(s_off + (d[None, :] + HALF) * ss_d, mask=mask, other=0.0).to(tl.float32)"]
        for j in group:
            ot = g.type_of(outs[j]["out"])
            dt = ot.dtype if ot is not None else "float32"

            def r(e: str, dt: str = dt) -> str:
                return round_expr(f"({e})", dt)

            if htile:
                k += [f"    if (grp >= G{j}_start) & (grp < G{j}_start + G{j}):",
                      f"        h = ((grp - G{j}_start) * HB + tl.arange(0, HB)).to(tl.int64)",
                      f"        hm = mask[None, :, :] & (h < H{j})[:, None, None]",
                      f"        xb = x{j}_ptr + b * x{j}_b + h[:, None, None] * x{j}_h + t64[None, :, :] * x{j}_t",
                      f"        ob = o{j}_ptr + b * o{j}_b + h[:, None, None] * o{j}_h + t64[None, :, :] * o{j}_t",
                      f"        xa = tl.load(xb + d[None, None, :] * x{j}_d, mask=hm, other=0.0).to(tl.float32)",
                      f"        xc = tl.load(xb + (d[None, None, :] + HALF) * x{j}_d, mask=hm, other=0.0)"
                      ".to(tl.float32)",
                      f"        ya = {r(r('xa * c1[None, :, :]') + ' + ' + r('(-xc) * s1[None, :, :]'))}",
                      f"        yc = {r(r('xc * c2[None, :, :]') + ' + ' + r('xa * s2[None, :, :]'))}",
                      f"        tl.store(ob + d[None, None, :], {store_expr('ya', dt)}, mask=hm)",
                      f"        tl.store(ob + (d[None, None, :] + HALF), {store_expr('yc', dt)}, mask=hm)"]
                continue
            k += [f"    if (grp >= G{j}_start) & (grp < G{j}_start + G{j}):",
                  "        for hh in range(HB):",
                  f"            h = (grp - G{j}_start) * HB + hh",
                  f"            hm = mask & ((t[:, None] * 0 + h) < H{j})",
                  f"            xb = x{j}_ptr + b * x{j}_b + h * x{j}_h + t64 * x{j}_t",
                  f"            ob = o{j}_ptr + b * o{j}_b + h * o{j}_h + t64 * o{j}_t",
                  f"            xa = tl.load(xb + d[None, :] * x{j}_d, mask=hm, other=0.0).to(tl.float32)",
                  f"            xc = tl.load(xb + (d[None, :] + HALF) * x{j}_d, mask=hm, other=0.0).to(tl.float32)",
                  f"            ya = {r(r('xa * c1') + ' + ' + r('(-xc) * s1'))}",
                  f"            yc = {r(r('xc * c2') + ' + ' + r('xa * s2'))}",
                  f"            tl.store(ob + d[None, :], {store_expr('ya', dt)}, mask=hm)",
                  f"            tl.store(ob + (d[None, :] + HALF), {store_expr('yc', dt)}, mask=hm)"]
        return "\n".join(k)

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        outs = fm.attrs["outputs"]
        groups = [list(range(len(outs)))] if variant == "fused" else [[j] for j in range(len(outs))]
        cs = {(o["cos"], o["sin"]) for o in outs}
        if len(cs) != 1:
            raise TemplateError("all rotated tensors must share cos and sin")
        htile = bool(params.get("HTILE", 0))
        kernels = "\n\n\n".join(self._kernel(fm, grp, htile) for grp in groups)
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
            f.append(f"{name}[(triton.cdiv(T, BLOCK_T), B * g_start)]({', '.join(args)}, HALF=HALF, BLOCK_D=BLOCK_D, "
                     f"BLOCK_T=BLOCK_T, HB=HB, num_warps={int(params['num_warps'])}, "
                     f"num_stages={int(params['num_stages'])})")
        rets = []
        for j, o in enumerate(outs):
            nd = len(g.type_of(o["x"]).shape)  # type: ignore[union-attr]
            rets.append(f"o{j}" if nd == 4 else f"o{j}.squeeze(1)")
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        return module_source(fm, f"Rotary embedding ({variant}), rendered by kernelsmith.", kernels, f, "", params)
