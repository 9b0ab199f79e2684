"""Pointwise chains (SiLU/GELU-and-mul, activation chains, broadcast arithmetic): one kernel over the output's
elements. Inputs that already have the output's shape and layout are read at the flat offset; broadcast or
viewed inputs (a bias, a slice of a fused gate/up tensor) through their expanded strides, up to 4-D."""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch, leaf_of
from ks_inductor.evolve.graph import Ref
from ks_inductor.evolve.pointwise import (
    PointwiseUnsupported,
    Val,
    is_pointwise,
    lower_chain,
    store_expr,
    unfenced,
)
from ks_inductor.evolve.templates.base import (
    SM_COUNT_HELPER,
    Template,
    TemplateError,
    module_source,
    output_refs,
    rounding_default,
    rounding_space,
    torch_dtype,
    view_expr,
)

_BROADCAST_HELPER = '''
def _broadcast_shape(*shapes):
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        s = [1] * (n - len(s)) + list(s)
        for i, d in enumerate(s):
            if d != 1:
                out[i] = d
    return out


def _strides4(t, shape):
    e = t.expand(shape)
    st = [0] * (4 - len(shape)) + list(e.stride())
    return st
'''


def _contiguous(shape: list[int], stride: list[int] | None) -> bool:
    if stride is None:
        return False
    expect, acc = [], 1
    for d in reversed(shape):
        expect.append(acc)
        acc *= d
    return list(reversed(expect)) == list(stride) or any(d == 0 for d in shape)


class PointwiseTemplate(Template):
    name = "pointwise"
    families = ("pointwise", "act_mul")

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["flat", "persistent"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        s: dict[str, list[Any]] = {"BLOCK": [256, 512, 1024, 2048, 4096, 8192, 16384],
                                   "num_warps": [1, 2, 4, 8, 16], "EVICT": [0, 1]}
        if variant == "persistent":  # stages only pipeline loops
            s["WAVES"] = [1, 2, 4, 8, 16]
            s["num_stages"] = [1, 2, 3]
        return {**s, **rounding_space(fm)}

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        p: dict[str, Any] = {"BLOCK": 2048, "num_warps": 8, "EVICT": 0}
        if variant == "persistent":
            p["WAVES"] = 4
            p["num_stages"] = 1
        return {**p, **rounding_default(fm)}

    def _leaves(self, fm: FamilyMatch) -> dict[str, tuple[str, list]]:
        """Every value the chain reads from outside: graph name -> (placeholder, view nodes)."""
        g = fm.graph
        leaves: dict[str, tuple[str, list]] = {}
        for n in g.compute_nodes():
            for r in n.refs():
                node = g.node(r)
                if node is not None and is_pointwise(node):
                    continue
                leaf = leaf_of(g, Ref(r))
                if leaf is None:
                    raise TemplateError(f"value {r} is neither computed pointwise nor a (viewed) input")
                leaves[r] = leaf
        return leaves

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        g = fm.graph
        outs = output_refs(g)
        out_t = g.type_of(outs[0])
        if out_t is None or not 1 <= len(out_t.shape) <= 4 and out_t.shape:
            raise TemplateError("outputs must be 0- to 4-D tensors")
        leaves = self._leaves(fm)
        flat: dict[str, bool] = {}
        spec_strides = {f"p{len(fm.state) + i}": s.stride for i, s in enumerate(fm.problem.input_specs)}
        for r, (p, views) in leaves.items():
            t = g.type_of(p)
            stride = spec_strides.get(p) if not fm.is_state(p) else None
            if fm.is_state(p) and t is not None:
                stride = None if views else [1] * len(t.shape)
                if t is not None and not views:
                    acc, st = 1, []
                    for d in reversed(t.shape):
                        st.append(acc)
                        acc *= d
                    stride = list(reversed(st))
            flat[r] = (not views and t is not None and t.shape == out_t.shape and _contiguous(t.shape, stride))
        env = {r: Val(f"v{i}") for i, r in enumerate(leaves)}
        names = list(leaves)
        for i, r in enumerate(names):
            t = g.type_of(leaves[r][0])
            if t is not None and t.dtype in ("int64", "int32", "int16", "int8", "uint8"):
                env[r] = Val(f"v{i}", "i")
            elif t is not None and t.dtype == "bool":
                env[r] = Val(f"v{i}", "b")
        try:
            nodes = list(g.compute_nodes())
            lines = lower_chain(nodes, env, unfenced(nodes))
        except PointwiseUnsupported as e:
            raise TemplateError(str(e)) from None
        strided = [r for r in names if not flat[r]]
        big = out_t.numel >= 2**31 - 1
        sig = ", ".join(f"in{i}_ptr" for i in range(len(names)))
        sig += (", " if names else "") + ", ".join(f"out{j}_ptr" for j in range(len(outs))) + ", numel"
        if strided:
            sig += ", D1, D2, D3, " + ", ".join(f"s{names.index(r)}_{k}" for r in strided for k in range(4))
        persistent = variant == "persistent"
        k = ["@triton.jit", f"def _pointwise_kernel({sig}, BLOCK: tl.constexpr):"]
        ind = "    "
        if persistent:
            k += ["    n_blocks = tl.cdiv(numel, BLOCK)",
                  "    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):"]
            ind = "        "
            start = "blk.to(tl.int64) * BLOCK" if big else "blk * BLOCK"
        else:
            start = "tl.program_id(0).to(tl.int64) * BLOCK" if big else "tl.program_id(0) * BLOCK"
        k += [ind + f"offs = {start} + tl.arange(0, BLOCK)", ind + "mask = offs < numel"]
        if strided:
            k += [ind + "i3 = offs % D3", ind + "r = offs // D3", ind + "i2 = r % D2", ind + "r = r // D2",
                  ind + "i1 = r % D1", ind + "i0 = r // D1"]
        for i, r in enumerate(names):
            if flat[r]:
                addr = "offs"
            else:
                addr = f"i0 * s{i}_0 + i1 * s{i}_1 + i2 * s{i}_2 + i3 * s{i}_3"
            conv = ".to(tl.float32)" if env[r].kind == "f" else ""
            evict = ', eviction_policy="evict_first"' if params.get("EVICT") and flat[r] else ""
            k.append(ind + f"v{i} = tl.load(in{i}_ptr + {addr}, mask=mask, other=0{evict}){conv}")
        k += [ind + ln for ln in lines]
        for j, o in enumerate(outs):
            k.append(ind + f"tl.store(out{j}_ptr + offs, {store_expr(env[o].expr, g.type_of(o).dtype)}, mask=mask)")
        kernel = "\n".join(k)

        f: list[str] = []
        for i, r in enumerate(names):
            expr = view_expr(fm, g, leaves[r])
            f.append(f"t{i} = {expr}" + (".contiguous()" if flat[r] else ""))
        if names:
            f.append("shape = _broadcast_shape(" + ", ".join(f"t{i}.shape" for i in range(len(names))) + ")")
            dev = "t0.device"
        else:
            f.append(f"shape = {list(out_t.shape)!r}")
            dev = "'cpu'"
        for j, o in enumerate(outs):
            f.append(f"out{j} = torch.empty(shape, dtype={torch_dtype(g.type_of(o).dtype)}, device={dev})")
        f.append("numel = out0.numel()")
        f.append(f"BLOCK = {int(params['BLOCK'])}")
        f.append("n_blocks = triton.cdiv(numel, BLOCK)")
        if persistent:
            f.append(f"grid = (max(1, min(n_blocks, _sm_count(out0) * {int(params['WAVES'])})),)")
        else:
            f.append("grid = (max(1, n_blocks),)")
        call = ", ".join(f"t{i}" for i in range(len(names)))
        call += (", " if names else "") + ", ".join(f"out{j}" for j in range(len(outs))) + ", numel"
        if strided:
            f.append("dims = [1] * (4 - len(shape)) + list(shape)")
            for r in strided:
                i = names.index(r)
                f.append(f"st{i} = _strides4(t{i}, shape)")
            call += ", dims[1], dims[2], dims[3], " + ", ".join(
                f"st{names.index(r)}[{k_}]" for r in strided for k_ in range(4))
        f.append(f"_pointwise_kernel[grid]({call}, BLOCK=BLOCK, num_warps={int(params['num_warps'])}, "
                 f"num_stages={int(params.get('num_stages', 1))})")
        rets = [f"out{j}" for j in range(len(outs))]
        f.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))
        helpers = _BROADCAST_HELPER + (SM_COUNT_HELPER if persistent else "")
        return module_source(fm, f"Pointwise chain ({variant}), rendered by kernelsmith.", kernel, f, helpers, params)
