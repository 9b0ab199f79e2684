"""Cross-entropy of logits against class indices: one sweep per row with a per-lane online log-sum-exp that also
picks out the target logit, then a small deterministic reduction (mean over non-ignored rows, or sum)."""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch
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


def _last_dim(dims: Any, ndim: int) -> bool:
    if isinstance(dims, list):
        if len(dims) != 1:
            return False
        dims = dims[0]
    return isinstance(dims, int) and (dims == -1 or dims == ndim - 1)


def match(graph: Graph) -> dict[str, Any] | None:
    """A log-softmax over the last dim of 2-D logits, gathered at integer targets and negated, with the
    ignore_index mask and a mean, a sum or no reduction."""
    ops = graph.ops()
    if "_log_softmax" not in ops or "gather" not in ops or "neg" not in ops:
        return None
    ls = next(n for n in graph.nodes if n.op == "_log_softmax")
    src = graph.type_of(ls.args[0].name) if isinstance(ls.args[0], Ref) else None
    if src is None or len(src.shape) != 2 or not _last_dim(ls.args[1], 2):
        return None
    allowed = {"_log_softmax", "gather", "neg", "ne", "where", "scalar_tensor", "sum", "div", "_to_copy", "full",
               "mean"}
    if not set(ops) <= allowed:
        return None
    ignore = next((n.args[1] for n in graph.nodes if n.op == "ne" and len(n.args) > 1
                   and isinstance(n.args[1], int)), -100)
    target = next((p for p, t in graph.placeholders if t is not None and t.dtype in ("int64", "int32")), None)
    logits = ls.args[0].name
    out = graph.type_of(graph.outputs[0].name) if graph.outputs and isinstance(graph.outputs[0], Ref) else None
    if target is None or out is None or not logits.startswith("p"):
        return None
    reduction = "none" if out.shape else ("mean" if "div" in ops else "sum")
    return {"logits": logits, "target": target, "ignore_index": ignore, "reduction": reduction,
            "out_dtype": out.dtype}


_ROWS = '''
@triton.jit
def _ce_rows(logits_ptr, target_ptr, loss_ptr, valid_ptr, n_cols, stride, ignore_index,
             BLOCK: tl.constexpr, MODE: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0)
    tgt = tl.load(target_ptr + row)
    base = logits_ptr + row.to(tl.int64) * stride
    cols = tl.arange(0, BLOCK)
    if MODE == 0:  # the whole row at once
        cm = cols < n_cols
        x = tl.load(base + cols, mask=cm, other=-float('inf')).to(tl.float32)
        mx = tl.max(x, axis=0)
        total = tl.sum(tl.where(cm, tl.exp(x - mx), 0.0), axis=0)
        xt = tl.sum(tl.where(cols == tgt, x, 0.0), axis=0)
    elif MODE == 2:  # a running max and sum per row: one exp per logit, the target logit read directly
        m = -float('inf')
        total = 0.0
        for off in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
            c = off + cols
            x = tl.load(base + c, mask=c < n_cols, other=-float('inf')).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        mx = m
        inside = (tgt >= 0) & (tgt < n_cols)
        xt = tl.load(base + tl.where(inside, tgt, 0)).to(tl.float32)
    else:  # a running max and sum per lane, folded at the end
        m = tl.full([BLOCK], -float('inf'), tl.float32)
        s = tl.zeros([BLOCK], dtype=tl.float32)
        tv = tl.zeros([BLOCK], dtype=tl.float32)
        for off in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
            c = off + cols
            cm = c < n_cols
            x = tl.load(base + c, mask=cm, other=-float('inf')).to(tl.float32)
            # NaN kept, as in the softmax template's per-lane max: the fold drops lanes whose max is -inf.
            m_new = tl.maximum(m, x, propagate_nan=tl.PropagateNan.ALL)
            alpha = tl.where(m_new == -float('inf'), 1.0, tl.exp(m - m_new))
            s = s * alpha + tl.where(cm, tl.exp(x - m_new), 0.0)
            m = m_new
            tv += tl.where(c == tgt, x, 0.0)
        mx = tl.max(m, axis=0)
        total = tl.sum(tl.where(m == -float('inf'), 0.0, s * tl.exp(m - mx)), axis=0)
        xt = tl.sum(tv, axis=0)
    valid = tgt != ignore_index
    loss = tl.where(valid, mx + tl.log(total) - xt, 0.0)
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    tl.store(valid_ptr + row, valid.to(tl.float32))


@triton.jit
def _ce_reduce(loss_ptr, valid_ptr, out_ptr, n_rows, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    cnt = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, n_rows, BLOCK):
        o = off + offs
        m = o < n_rows
        acc += tl.load(loss_ptr + o, mask=m, other=0.0)
        cnt += tl.load(valid_ptr + o, mask=m, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.sum(cnt, axis=0)
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))
'''


class CrossEntropyTemplate(Template):
    name = "cross_entropy"
    families = ("cross_entropy",)

    def variants(self, fm: FamilyMatch) -> list[str]:
        return ["online", "online_block", "onepass"]

    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        s: dict[str, list[Any]] = {"num_warps": [2, 4, 8, 16, 32], "num_stages": [1, 2, 3, 4]}
        if variant.startswith("online"):
            s["BLOCK"] = [512, 1024, 2048, 4096, 8192, 16384]
        return s

    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]:
        # One stage: the column loops as they ran before the stages reached them (the launch alone pipelines no load
        # that feeds no dot); more stages are for the search to try.
        p: dict[str, Any] = {"num_warps": 8 if variant.startswith("online") else 16, "num_stages": 1}
        if variant.startswith("online"):
            p["BLOCK"] = 2048
        return p

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        n = fm.graph.type_of(fm.attrs["logits"]).shape[-1]  # type: ignore[union-attr]
        block = params.get("BLOCK", next_pow2(n)) if variant.startswith("online") else next_pow2(n)
        return elems_per_thread(block, params["num_warps"]) <= MAX_ELEMS_PER_THREAD

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        d = super().descriptor(fm, params, variant)
        n = fm.graph.type_of(fm.attrs["logits"]).shape[-1]  # type: ignore[union-attr]
        d["block"] = block_class(params.get("BLOCK", n))
        return d

    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str:
        a = fm.attrs
        x, t = fm.operand(a["logits"]), fm.operand(a["target"])
        onepass = variant == "onepass"
        mode = {"onepass": 0, "online": 1, "online_block": 2}[variant]
        block = "triton.next_power_of_2(n_cols)" if onepass else str(int(params["BLOCK"]))
        out_dt = torch_dtype(a["out_dtype"])
        body = [
            f"x = {x}",
            f"tgt = {t}.contiguous()",
            "n_rows, n_cols = x.shape",
            "losses = torch.empty((n_rows,), dtype=torch.float32, device=x.device)",
            "valid = torch.empty((n_rows,), dtype=torch.float32, device=x.device)",
            f"_ce_rows[(n_rows,)](x, tgt, losses, valid, n_cols, x.stride(0), {int(a['ignore_index'])}, "
            f"BLOCK={block}, MODE={mode}, STAGES={int(params['num_stages'])}, num_warps={int(params['num_warps'])}, "
            f"num_stages={int(params['num_stages'])})",
        ]
        if a["reduction"] == "none":
            body[3] = f"losses = torch.empty((n_rows,), dtype={out_dt}, device=x.device)"
            body.append("return losses")
        else:
            mean = a["reduction"] == "mean"
            body += [f"out = torch.empty((), dtype={out_dt}, device=x.device)",
                     f"_ce_reduce[(1,)](losses, valid, out, n_rows, MEAN={mean}, BLOCK=1024, num_warps=4)",
                     "return out"]
        return module_source(fm, f"Cross-entropy ({variant}), rendered by kernelsmith.", _ROWS, body)


register(Family("cross_entropy", priority=30, match=match, templates=(CrossEntropyTemplate(),)))
