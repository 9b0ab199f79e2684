"""Softmax and log-softmax over long rows, chunked: an online max/sum sweep, then a write sweep.

The whole-row one-pass kernel lives in the row-wise template; this one is the structural alternative for rows
too long to hold in registers. It reads the row twice; with L2HINT the first sweep asks L2 to keep the row and the
second to drop it, so the second read can come from L2 rather than memory. CHUNK_MAX keeps one running max per row
(a block reduction per chunk, one exponential per element) instead of one per lane (no reduction in the loop, but
a second exponential per element for the rescaling, which at bf16 bandwidth can make the special-function unit
the bottleneck).
"""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.graph import Ref
from ks_inductor.evolve.templates.base import (
    MAX_ELEMS_PER_THREAD,
    Template,
    TemplateError,
    elems_per_thread,
    module_source,
    torch_dtype,
)

_KERNEL = '''
@triton.jit
def _softmax_online(x_ptr, out_ptr, n_cols, sx, so, BLOCK: tl.constexpr, LOG: tl.constexpr,
                    CHUNK_MAX: tl.constexpr, KEEP: tl.constexpr, DROP: tl.constexpr, STAGES: tl.constexpr):
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
    for off in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = off + cols
        cm = c < n_cols
        x = tl.load(x_ptr + row * sx + c, mask=cm, other=0.0, eviction_policy=DROP).to(tl.float32)
        if LOG:
            y = x - mx - tl.log(total)
        else:
            y = tl.exp(x - mx) / total
        tl.store(out_ptr + row * so + c, y.to(out_ptr.dtype.element_ty), mask=cm)
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
        return ["online"]

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
            f"STAGES={int(params['num_stages'])}, num_warps={int(params['num_warps'])}, "
            f"num_stages={int(params['num_stages'])})",
            "return out.view(x.shape)",
        ]
        return module_source(fm, "Chunked online softmax, rendered by kernelsmith.", _KERNEL, body)
