"""Attention of a few query rows over a key/value sequence (the decode step), with its prologue fused.

What the region computes: ``sdpa(q, cat(k_cache, k_new), cat(v_cache, v_new))`` with grouped-query heads, where q
and the new rows may be rotated (RoPE) on the way in. Unfused, the concatenation copies the whole cache before
attention reads it again; here one kernel reads each cached row once, rotates q and the new rows in registers,
and never materialises the concatenated keys and values.

One program takes one key/value head of one batch entry and all the query rows that share it (the group's heads
times the query positions, padded to a ``tl.dot`` tile), and walks its slice of the sequence with an online
softmax. Variants:

- ``split``: the sequence is cut into slices of ``SPLIT`` rows so that enough programs run when batch x heads is
  small; each writes fp32 partials (running max, sum, weighted values), and a second kernel combines them;
- ``direct``: one program walks the whole sequence and writes the output itself (no workspace, one launch).
"""

from __future__ import annotations

import math
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import keeps_shape, leaf_of, rope_of
from ks_inductor.seeds.families.registry import Family, register
from ks_inductor.seeds.families.template import (
    SMEM_BYTES,
    Template,
    TemplateError,
    block_class,
    module_source,
    next_pow2,
    torch_dtype,
    view_expr,
)
from ks_inductor.seeds.graph import Graph, Ref
from ks_inductor.seeds.pointwise import round_expr, store_expr, tl_dtype


def _attention_source(graph: Graph, ref: Any, covered: list[str]) -> dict[str, Any] | None:
    """An attention operand made of the rows of one placeholder: read as it is, or rotated (RoPE) on the way."""
    leaf = leaf_of(graph, ref)
    if leaf is not None:
        return {"kind": "plain", "leaf": leaf}
    r = rope_of(graph, ref)
    if r is None:
        return None
    covered += r["covered"]
    return {"kind": "rope", "leaf": r["x_leaf"], "cos_leaf": r["cos_leaf"], "sin_leaf": r["sin_leaf"]}


def match(graph: Graph) -> dict[str, Any] | None:
    """One ``kernelsmith::sdpa`` (see ks_inductor.canonical_ops) whose q is read plain or rotated, and whose k and
    v are each a placeholder, or a cache placeholder concatenated along the sequence with new rows (plain or
    rotated): the decode step of a transformer layer. No mask, no dropout, no causal mask."""
    # lazily: canonical_ops imports torch, which classification only needs later
    from ks_inductor.canonical_ops import SDPA_TARGET

    att = [n for n in graph.nodes if n.target == SDPA_TARGET]
    if len(att) != 1 or len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref):
        return None
    sd = att[0]
    q, k, v, mask, dropout, causal, scale = (sd.args + [None] * 7)[:7]
    if mask is not None or dropout not in (0, 0.0) or causal:
        return None
    tq, tk, tv = (graph.type_of(r.name) if isinstance(r, Ref) else None for r in (q, k, v))
    if tq is None or tk is None or tv is None or not (len(tq.shape) == len(tk.shape) == len(tv.shape) == 4):
        return None
    B, H, TQ, D = tq.shape
    HK = tk.shape[1]
    if tk.shape[0] != B or tv.shape[:3] != tk.shape[:3] or tk.shape[3] != D or tv.shape[3] != D or H % HK:
        return None
    covered = [sd.name]
    qsrc = _attention_source(graph, q, covered)
    if qsrc is None:
        return None
    kv = []
    for r in (k, v):
        node = graph.node(r.name)
        if node is not None and node.op == "cat":
            parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
            if not isinstance(parts, list) or len(parts) != 2 or dim not in (2, -2):
                return None
            cache = leaf_of(graph, parts[0])
            new = _attention_source(graph, parts[1], covered)
            ct = graph.type_of(parts[0].name)
            if cache is None or new is None or ct is None:
                return None
            covered.append(node.name)
            kv.append({"cache": {"kind": "plain", "leaf": cache}, "new": new, "P": ct.shape[2]})
        else:
            src = _attention_source(graph, r, covered)
            if src is None:
                return None
            kv.append({"cache": None, "new": src, "P": 0})
    # k and v walk one sequence: the same cache length on both (or no cache on both)
    lens = [e["P"] for e in kv]
    if lens[0] != lens[1]:
        return None
    if set(n.name for n in graph.compute_nodes()) - set(covered):
        return None
    # after the op only views: permutes, then reshapes
    down, perm, reshaped = sd.name, [0, 1, 2, 3], False
    for n in graph.nodes:
        if down not in n.refs():
            continue
        if n.op in ("view", "_unsafe_view", "reshape") and keeps_shape(graph, n, down):
            pass  # transformers' attention reshapes its output to the shape it has before transposing it
        elif n.op == "permute" and not reshaped:
            perm = [perm[i] for i in n.args[1]]
        elif n.op in ("view", "_unsafe_view", "reshape", "clone", "alias"):
            reshaped = True
        else:
            return None
        down = n.name
    if graph.outputs[0].name != down:
        return None
    return {"q": qsrc, "k": kv[0], "v": kv[1], "B": B, "H": H, "HK": HK, "TQ": TQ, "D": D, "scale": scale,
            "perm": perm, "out": down, "N": tk.shape[2]}


MAX_QUERY_ROWS = 128  # group heads x query positions held by one program; beyond that this is not decode
# Programs a split launch aims at: two waves of a 132-SM GPU. A short cache over few sequences x heads (a decode step
# early in generation: 16 x 8 programs over 129 positions) otherwise leaves half the SMs idle at the default slice.
SPLIT_PROGRAMS = 264
LOG2E = 1.4426950408889634


class AttentionTemplate(Template):
    name = "attention"
    families = ("attention",)

    def applicable(self, fm: FamilyMatch) -> bool:
        if fm.family not in self.families:
            return False
        a = fm.attrs
        return a["H"] // a["HK"] * a["TQ"] <= MAX_QUERY_ROWS and a["D"] in (16, 32, 64, 128, 256)

    def variants(self, fm: FamilyMatch) -> list[str]:
        # The first is the template's best guess, which a search seeds. A sequence no longer than the default
        # slice is one slice: ``split`` would then do ``direct``'s work and launch a combining kernel besides.
        n = int(fm.attrs.get("N") or 0)
        return ["direct", "split"] if 0 < n <= self.default(fm, "split", fm.target)["SPLIT"] else ["split", "direct"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        sp: dict[str, list[Any]] = {"BLOCK_N": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8],
                                    "num_stages": [1, 2, 3, 4]}
        if variant == "split":
            sp["SPLIT"] = [64, 128, 256, 512, 1024, 2048, 4096]
            sp["COMBINE_WARPS"] = [1, 2, 4, 8]
        return sp

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        # Three stages: a program's walk over its keys waits on memory, not arithmetic, and the second tile in
        # flight pays (a decode step over 129 rows on an H100: faster than two stages in every direct configuration
        # timed, 9-12% at this tile; docs/findings.md, "Decode attention at a short cache").
        p: dict[str, Any] = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
        if variant == "split":
            p.update(SPLIT=256, COMBINE_WARPS=4)
        return p

    def alternates(self, fm: FamilyMatch, variant: str, device: str) -> list[dict[str, Any]]:
        """Where the default slice leaves the GPU short of programs, a slice cut for ``SPLIT_PROGRAMS`` (split), and
        a narrower key tile for one program per sequence x head (direct)."""
        a = fm.attrs
        n = int(a.get("N") or 0)
        if not n:
            return []
        base = self.default(fm, variant, device)
        if variant == "direct":
            return [{**base, "BLOCK_N": 32}] if n <= 1024 else []
        per = max(1, -(-SPLIT_PROGRAMS // (a["B"] * a["HK"])))
        split = max(64, next_pow2(-(-n // per)))
        if split >= base["SPLIT"]:
            return []
        alt = {**base, "SPLIT": split, "BLOCK_N": min(base["BLOCK_N"], split)}
        return [alt] if self.feasible(fm, alt, variant) else []

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        a = fm.attrs
        elt = 4 if self._dtype(fm) == "float32" else 2
        # K and V tiles per pipeline stage
        if max(1, params["num_stages"] - 1) * 2 * params["BLOCK_N"] * a["D"] * elt > SMEM_BYTES:
            return False
        if variant == "split" and params["SPLIT"] < params["BLOCK_N"]:
            return False
        rows = self._block_m(fm)
        per_thread = (rows * a["D"] + 2 * params["BLOCK_N"] * a["D"] + rows * params["BLOCK_N"]) / (
            32 * params["num_warps"])
        return per_thread <= 256

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        d["block"] = block_class(params["BLOCK_N"] * fm.attrs["D"] // 16)
        d["dot"] = True
        return d

    # ------------------------------------------------------------------------------------------ pieces

    @staticmethod
    def _dtype(fm: FamilyMatch) -> str:
        t = fm.graph.type_of(fm.attrs["out"])
        if t is None:
            raise TemplateError("attention output without a type")
        return t.dtype

    @staticmethod
    def _block_m(fm: FamilyMatch) -> int:
        return max(16, next_pow2(fm.attrs["H"] // fm.attrs["HK"] * fm.attrs["TQ"]))

    def _dot(self, fm: FamilyMatch, a: str, b: str, acc: str | None = None) -> str:
        dt = self._dtype(fm)
        if dt in ("float32", "float64"):
            return f"tl.dot({a}, {b}{', ' + acc if acc else ''}, input_precision=\"ieee\")"
        if fm.target == "cpu":  # the interpreter's bf16/fp16 dot multiplies raw bit patterns
            return (f"tl.dot({a}.to(tl.float32), {b}.to(tl.float32){', ' + acc if acc else ''}, "
                    "input_precision=\"ieee\")")
        return f"tl.dot({a}, {b}{', ' + acc if acc else ''})"

    @staticmethod
    def _rows(name: str, src: dict[str, Any], head: str, pos: str, mask: str, dt: str, indent: str) -> list[str]:
        """Lines loading rows of one operand into ``name`` (fp32, rounded where eager rounds)."""
        base = f"{name}_ptr + b * {name}_sb + ({head}) * {name}_sh + ({pos}) * {name}_st"
        lines = [f"{name}_x = tl.load({base} + d[None, :] * {name}_sd, mask={mask}, other=0.0).to(tl.float32)"]
        if src["kind"] == "rope":
            def r(e: str) -> str:
                return round_expr(f"({e})", dt)

            lines += [
                f"{name}_xr = tl.load({base} + dr[None, :] * {name}_sd, mask={mask}, other=0.0).to(tl.float32)",
                f"{name}_xr = tl.where(d[None, :] < HALF, -{name}_xr, {name}_xr)",
                f"{name}_c = tl.load({name}c_ptr + b * {name}c_sb + ({pos}) * {name}c_st + d[None, :] * {name}c_sd, "
                f"mask={mask}, other=0.0).to(tl.float32)",
                f"{name}_s = tl.load({name}s_ptr + b * {name}s_sb + ({pos}) * {name}s_st + d[None, :] * {name}s_sd, "
                f"mask={mask}, other=0.0).to(tl.float32)",
                f"{name}_x = {r(r(f'{name}_x * {name}_c') + ' + ' + r(f'{name}_xr * {name}_s'))}",
            ]
        lines.append(f"{name}_t = {name}_x.to({tl_dtype(dt)})")
        return [indent + ln for ln in lines]

    @staticmethod
    def _sig(name: str, src: dict[str, Any] | None) -> list[str]:
        if src is None:
            return []
        s = [f"{name}_ptr", f"{name}_sb", f"{name}_sh", f"{name}_st", f"{name}_sd"]
        if src["kind"] == "rope":
            s += [f"{name}c_ptr", f"{name}c_sb", f"{name}c_st", f"{name}c_sd",
                  f"{name}s_ptr", f"{name}s_sb", f"{name}s_st", f"{name}s_sd"]
        return s

    def _kernels(self, fm: FamilyMatch, variant: str) -> str:
        a = fm.attrs
        dt = self._dtype(fm)
        cache = a["k"]["cache"] is not None
        srcs = {"q": a["q"], "kn": a["k"]["new"], "vn": a["v"]["new"]}
        plain = {"kind": "plain"}
        sig = self._sig("q", srcs["q"])
        if cache:
            sig += self._sig("kc", plain) + self._sig("vc", plain)
        sig += self._sig("kn", srcs["kn"]) + self._sig("vn", srcs["vn"])
        sig += ["o_ptr", "o_sb", "o_sh", "o_st", "o_sd", "w_o", "w_m", "w_l", "HK", "G", "TQ", "P", "TN", "SPLIT",
                "NS"]
        # a literal, not an argument: Inductor passes Python floats to user kernels as fp64, which would carry
        # the scores, and the dot's accumulator, to fp64
        scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(a["D"])
        qk_scale = repr(float(scale * LOG2E))
        step = [
            "@triton.jit",
            "def _attn_step(q, k, v, nmask, m_i, l_i, acc):",
            f"    s = {self._dot(fm, 'q', 'tl.trans(k)')} * {qk_scale}",
            "    s = tl.where(nmask[None, :], s, float('-inf'))",
            "    m_new = tl.maximum(m_i, tl.max(s, 1))",
            "    alpha = tl.exp2(m_i - m_new)",
            "    p = tl.exp2(s - m_new[:, None])",
            "    l_i = l_i * alpha + tl.sum(p, 1)",
            f"    acc = {self._dot(fm, 'p.to(v.dtype)', 'v', 'acc * alpha[:, None]')}",
            "    return m_new, l_i, acc",
        ]
        k = [
            "@triton.jit",
            f"def _attn_fwd({', '.join(sig)}, D: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr, "
            "BLOCK_N: tl.constexpr, DIRECT: tl.constexpr):",
            "    pid = tl.program_id(0)",
            "    sid = tl.program_id(1)",
            "    b = (pid // HK).to(tl.int64)",
            "    hk = (pid % HK).to(tl.int64)",
            "    r = tl.arange(0, BLOCK_M)",
            "    rmask = r < G * TQ",
            "    h = hk * G + (r // TQ).to(tl.int64)",
            "    t = (r % TQ).to(tl.int64)",
            "    d = tl.arange(0, D)",
            "    dr = (d + HALF) % D",
        ]
        k += self._rows("q", srcs["q"], "h[:, None]", "t[:, None]", "rmask[:, None]", dt, "    ")
        k += [
            "    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)",
            "    l_i = tl.zeros([BLOCK_M], tl.float32)",
            "    acc = tl.zeros([BLOCK_M, D], tl.float32)",
            "    lo = sid * SPLIT",
            "    hi = tl.minimum(lo + SPLIT, P + TN)",
        ]
        if cache:
            # the hot loop: cached rows go to the dot as loaded, without _rows' fp32 round trip
            k += [
                "    hi_c = tl.minimum(hi, P)",
                "    for start in range(lo, hi_c, BLOCK_N):",
                "        n = (start + tl.arange(0, BLOCK_N)).to(tl.int64)",
                "        nmask = n < hi_c",
                "        kt = tl.load(kc_ptr + b * kc_sb + hk * kc_sh + n[:, None] * kc_st + d[None, :] * kc_sd, "
                "mask=nmask[:, None], other=0.0)",
                "        vt = tl.load(vc_ptr + b * vc_sb + hk * vc_sh + n[:, None] * vc_st + d[None, :] * vc_sd, "
                "mask=nmask[:, None], other=0.0)",
                "        m_i, l_i, acc = _attn_step(q_t, kt, vt, nmask, m_i, l_i, acc)",
            ]
        k += [
            "    lo_n = tl.maximum(lo, P) - P",
            "    hi_n = hi - P",
            "    for start in range(lo_n, hi_n, BLOCK_N):",
            "        n = (start + tl.arange(0, BLOCK_N)).to(tl.int64)",
            "        nmask = n < hi_n",
        ]
        k += self._rows("kn", srcs["kn"], "hk", "n[:, None]", "nmask[:, None]", dt, "        ")
        k += self._rows("vn", srcs["vn"], "hk", "n[:, None]", "nmask[:, None]", dt, "        ")
        k += [
            "        m_i, l_i, acc = _attn_step(q_t, kn_t, vn_t, nmask, m_i, l_i, acc)",
            "    if DIRECT:",
            "        out = acc / l_i[:, None]",
            "        o = o_ptr + b * o_sb + h[:, None] * o_sh + t[:, None] * o_st + d[None, :] * o_sd",
            f"        tl.store(o, {store_expr('out', dt)}, mask=rmask[:, None])",
            "    else:",
            "        w = (pid * NS + sid) * BLOCK_M + r",
            "        tl.store(w_o + w[:, None] * D + d[None, :], acc, mask=rmask[:, None])",
            "        tl.store(w_m + w, m_i, mask=rmask)",
            "        tl.store(w_l + w, l_i, mask=rmask)",
        ]
        kernels = ["\n".join(step), "\n".join(k)]
        if variant == "split":
            kernels.append("\n".join([
                "@triton.jit",
                "def _attn_combine(w_o, w_m, w_l, o_ptr, o_sb, o_sh, o_st, o_sd, HK, G, TQ, NS, D: tl.constexpr, "
                "BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):",
                "    pid = tl.program_id(0)",
                "    bh = pid // (G * TQ)",
                "    r = pid % (G * TQ)",
                "    b = (bh // HK).to(tl.int64)",
                "    h = ((bh % HK) * G + r // TQ).to(tl.int64)",
                "    t = (r % TQ).to(tl.int64)",
                "    s = tl.arange(0, BLOCK_S)",
                "    smask = s < NS",
                "    d = tl.arange(0, D)",
                "    w = (bh * NS + s) * BLOCK_M + r",
                "    m = tl.load(w_m + w, mask=smask, other=float('-inf'))",
                "    lsum = tl.load(w_l + w, mask=smask, other=0.0)",
                "    scale = tl.where(smask, tl.exp2(m - tl.max(m, 0)), 0.0)",
                "    total = tl.sum(scale * lsum, 0)",
                "    part = tl.load(w_o + w[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)",
                "    out = tl.sum(part * scale[:, None], 0) / total",
                f"    tl.store(o_ptr + b * o_sb + h * o_sh + t * o_st + d * o_sd, {store_expr('out', dt)})",
            ]))
        return "\n\n\n".join(kernels)

    # ------------------------------------------------------------------------------------------ render

    def _operand(self, fm: FamilyMatch, name: str, src: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Forward lines binding ``name`` (and its cos/sin) to 4-D views, and the launch arguments."""
        g = fm.graph
        leaf = src["leaf"]
        lines = [f"{name} = {view_expr(fm, g, leaf)}", f"assert {name}.dim() == 4"]
        args = [name, f"{name}.stride(0)", f"{name}.stride(1)", f"{name}.stride(2)", f"{name}.stride(3)"]
        if src["kind"] == "rope":
            for suffix, key in (("c", "cos_leaf"), ("s", "sin_leaf")):
                nm = f"{name}{suffix}"
                lines += [f"{nm} = {view_expr(fm, g, src[key])}",
                          f"{nm} = {nm}.reshape(1, 1, *{nm}.shape) if {nm}.dim() == 2 else "
                          f"({nm}.unsqueeze(1) if {nm}.dim() == 3 else {nm})",
                          f"assert {nm}.shape[1] == 1, 'cos/sin must be shared by the heads'",
                          f"{nm} = {nm}.expand({name}.shape[0], 1, {name}.shape[2], {name}.shape[3])"]
                args += [nm, f"{nm}.stride(0)", f"{nm}.stride(2)", f"{nm}.stride(3)"]
        return lines, args

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        if not self.applicable(fm):
            raise TemplateError("not a decode-sized attention")
        a = fm.attrs
        dt = self._dtype(fm)
        out_t = fm.graph.type_of(a["out"])
        perm = a["perm"]
        inv = sorted(range(4), key=perm.__getitem__)
        f: list[str] = []
        args: list[str] = []
        cache = a["k"]["cache"] is not None
        operands = [("q", a["q"])] + ([("kc", a["k"]["cache"]), ("vc", a["v"]["cache"])] if cache else [])
        for nm, src in operands + [("kn", a["k"]["new"]), ("vn", a["v"]["new"])]:
            lines, op_args = self._operand(fm, nm, src)
            f += lines
            args += op_args
        dims = [a["B"], a["H"], a["TQ"], a["D"]]
        block_n = int(params["BLOCK_N"])
        f += [
            "B, H, TQ, D = q.shape",
            "HK = kn.shape[1]",
            "G = H // HK",
            f"P = {'kc.shape[2]' if cache else '0'}",
            "TN = kn.shape[2]",
            f"buf = torch.empty({[dims[i] for i in perm]!r}, dtype={torch_dtype(dt)}, device=q.device)",
            f"o = buf.permute({inv!r})",
            f"BLOCK_M = {self._block_m(fm)}",
        ]
        common = (f"D=D, HALF=D // 2, BLOCK_M=BLOCK_M, BLOCK_N={block_n}, num_warps={int(params['num_warps'])}, "
                  f"num_stages={int(params['num_stages'])}")
        o_args = "o, o.stride(0), o.stride(1), o.stride(2), o.stride(3)"
        if variant == "split":
            f += [
                f"SPLIT = {int(params['SPLIT'])}",
                "NS = triton.cdiv(P + TN, SPLIT)",
                "w_o = torch.empty((B * HK * NS * BLOCK_M, D), dtype=torch.float32, device=q.device)",
                "w_m = torch.empty((B * HK * NS * BLOCK_M,), dtype=torch.float32, device=q.device)",
                "w_l = torch.empty((B * HK * NS * BLOCK_M,), dtype=torch.float32, device=q.device)",
                f"_attn_fwd[(B * HK, NS)]({', '.join(args)}, {o_args}, w_o, w_m, w_l, HK, G, TQ, P, TN, SPLIT, NS, "
                f"{common}, DIRECT=False)",
                f"_attn_combine[(B * HK * G * TQ,)](w_o, w_m, w_l, {o_args}, HK, G, TQ, NS, D=D, BLOCK_M=BLOCK_M, "
                f"BLOCK_S=triton.next_power_of_2(NS), num_warps={int(params['COMBINE_WARPS'])})",
            ]
        else:
            f += [f"_attn_fwd[(B * HK, 1)]({', '.join(args)}, {o_args}, o, o, o, HK, G, TQ, P, TN, P + TN, 1, "
                  f"{common}, DIRECT=True)"]
        f.append(f"return buf.reshape({list(out_t.shape)!r})" if out_t is not None else "return buf")
        return module_source(fm, f"Decode attention ({variant}) with its prologue fused, rendered by kernelsmith.",
                             self._kernels(fm, variant), f)


register(Family("attention", priority=20, match=match, templates=(AttentionTemplate(),)))
