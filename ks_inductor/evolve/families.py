"""Which op family a problem belongs to, read from its aten graph, with what a template needs to know.

Classification looks at the ops left after core-aten decomposition (``Problem.graph_text``), never at the
problem's name or source text: RMSNorm written by hand is pow/mean/add/rsqrt/mul whatever it is called.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, field
from math import prod
from typing import Any

from ks_inductor.candidate import parse_source
from ks_inductor.evolve.graph import VIEW_OPS, Graph, Node, Ref, TensorType, parse_graph
from ks_inductor.evolve.pointwise import is_pointwise
from ks_inductor.problem import Problem

log = logging.getLogger(__name__)

MATMUL_OPS = ("mm", "addmm", "bmm")
ROW_REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "native_layer_norm", "_softmax", "_log_softmax")
LEAF_VIEW_OPS = frozenset({"unsqueeze", "view", "_unsafe_view", "reshape", "expand", "permute", "slice", "squeeze",
                           "t", "transpose", "select", "alias", "detach", "clone", "lift_fresh_copy"})


@dataclass
class StateEntry:
    """A parameter or buffer of the problem's Model, in ``make_fx`` placeholder order."""

    name: str
    shape: list[int]
    dtype: str
    buffer: bool = False


@dataclass
class FamilyMatch:
    family: str
    problem: Problem
    graph: Graph
    state: list[StateEntry]
    init_signature: str
    attrs: dict[str, Any] = field(default_factory=dict)
    # Where the rendered kernels will run: "cuda" (also MACA) or "cpu" (the Triton interpreter, whose bf16 dot
    # multiplies raw bit patterns; templates work around it there).
    target: str = "cuda"

    # ----------------------------------------------------------------- placeholders
    def placeholder_index(self, name: str) -> int:
        return [p for p, _ in self.graph.placeholders].index(name)

    def is_state(self, name: str) -> bool:
        return self.placeholder_index(name) < len(self.state)

    def operand(self, name: str) -> str:
        """Python expression, inside ``ModelNew.forward``, for a placeholder."""
        i = self.placeholder_index(name)
        if i < len(self.state):
            return "self." + self.state[i].name
        return f"in{i - len(self.state)}"

    def nodes(self, key: str) -> list[Node]:
        """The graph nodes named by the list ``attrs[key]``."""
        return [n for n in (self.graph.node(name) for name in self.attrs[key]) if n is not None]

    @property
    def _ndim(self) -> int:
        return max((len(t.shape) for _, t in self.graph.placeholders if t is not None), default=1)

    @property
    def row_dims(self) -> tuple[int, int]:
        """The first and last dim a row-wise match reduces (``attrs["dims"]``); the last dim where it names none."""
        first, last = self.attrs.get("dims") or (self._ndim - 1, self._ndim - 1)
        return first, last

    @property
    def rows_are_last_dim(self) -> bool:
        """Whether a row is the last dim alone, as the row templates other than the row-wise one require."""
        return self.row_dims[0] == self._ndim - 1

    @property
    def n_inputs(self) -> int:
        return len(self.graph.placeholders) - len(self.state)

    @property
    def outputs(self) -> list[TensorType]:
        return [self.graph.type_of(o.name) for o in self.graph.outputs if isinstance(o, Ref)]  # type: ignore[misc]


def model_state(problem: Problem) -> tuple[list[StateEntry], str]:
    """Parameters and buffers of ``Model`` (names, shapes, dtypes) and the text of its constructor signature."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ks_inductor.problem import exec_problem_source

    mod = exec_problem_source(problem.source, f"<{problem.name}>")
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
    entries = [StateEntry(n, list(p.shape), str(p.dtype).replace("torch.", "")) for n, p in model.named_parameters()]
    entries += [StateEntry(n, list(b.shape), str(b.dtype).replace("torch.", ""), True)
                for n, b in model.named_buffers()]
    return entries, _init_signature(problem.source)


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


def _init_signature(source: str) -> str:
    try:
        tree = parse_source(source)
    except SyntaxError:
        return "*args, **kwargs"
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    args.args = args.args[1:]  # drop self
                    for a in args.args + args.kwonlyargs:
                        a.annotation = None
                    if args.vararg:
                        args.vararg.annotation = None
                    if args.kwarg:
                        args.kwarg.annotation = None
                    defaults = list(args.defaults) + [d for d in args.kw_defaults if d is not None]
                    if not all(_literal(d) for d in defaults):
                        return "*args, **kwargs"  # defaults naming module globals would not resolve in ModelNew
                    return ast.unparse(args)
    return "*args, **kwargs"


# --------------------------------------------------------------------------------------------- helpers


def leaf_of(graph: Graph, ref: Any) -> tuple[str, list[Node]] | None:
    """Follow view ops back from ``ref`` to a placeholder: (placeholder, the view nodes, outermost last)."""
    chain: list[Node] = []
    while isinstance(ref, Ref):
        if ref.name.startswith("p"):
            return ref.name, list(reversed(chain))
        node = graph.node(ref.name)
        if node is None or node.op not in LEAF_VIEW_OPS:
            return None
        chain.append(node)
        ref = node.args[0] if node.args else None
    return None


def _last_dim(dims: Any, ndim: int) -> bool:
    if isinstance(dims, list):
        if len(dims) != 1:
            return False
        dims = dims[0]
    return isinstance(dims, int) and (dims == -1 or dims == ndim - 1)


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


def _is_cross_entropy(graph: Graph) -> dict[str, Any] | None:
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


def rope_of(graph: Graph, ref: Any) -> dict[str, Any] | None:
    """``x * cos + rotate_half(x) * sin`` ending at ``ref``: the leaves (placeholder, views) of x, cos and sin, and
    the compute nodes the pattern spans; None if ``ref`` is not that."""
    add = graph.node(ref.name) if isinstance(ref, Ref) else None
    if add is None or add.op != "add" or len(add.args) != 2:
        return None
    x = cos = sin = None
    covered = [add.name]
    for term in add.args:
        mul = graph.node(term.name) if isinstance(term, Ref) else None
        if mul is None or mul.op != "mul":
            return None
        covered.append(mul.name)
        a, b = mul.args
        cat_side = next((s for s in (a, b) if isinstance(s, Ref) and (graph.node(s.name) or Node("", "", [], {}, [])).op == "cat"), None)
        other = b if cat_side is a else a
        leaf = leaf_of(graph, other)
        if cat_side is None:
            plain = leaf_of(graph, a), leaf_of(graph, b)
            if plain[0] is None or plain[1] is None:
                return None
            # x * cos: x is the operand with the larger (head) shape
            ta, tb = (graph.type_of(r.name) if isinstance(r, Ref) else None for r in (a, b))
            xa = ta is not None and tb is not None and ta.numel >= tb.numel
            x_leaf, cos_leaf = (plain[0], plain[1]) if xa else (plain[1], plain[0])
            x, cos = x_leaf[0], cos_leaf[0]
        else:
            if leaf is None:
                return None
            sin, sin_leaf = leaf[0], leaf
            cat = graph.node(cat_side.name)
            parts = cat.args[0] if cat else None
            if not isinstance(parts, list) or len(parts) != 2:
                return None
            neg = graph.node(parts[0].name) if isinstance(parts[0], Ref) else None
            if neg is None or neg.op != "neg" or not neg.args:
                return None
            halves = [_half_of(graph, neg.args[0]), _half_of(graph, parts[1])]
            covered += [cat.name, neg.name]  # type: ignore[union-attr]
    if x is None or cos is None or sin is None:
        return None
    tx = x_leaf[1][-1].type if x_leaf[1] else graph.type_of(x)
    tc = graph.type_of(cos)
    if tx is None or tc is None or len(tx.shape) < 2 or tx.shape[-1] % 2 or tc.shape[-1] != tx.shape[-1]:
        return None
    # rotate_half(x) is cat(-x[..., D/2:], x[..., :D/2]) of this same x
    chain = _chain_sig(x_leaf)
    if halves != [(chain, tx.shape[-1] // 2, tx.shape[-1]), (chain, 0, tx.shape[-1] // 2)]:
        return None
    return {"x_leaf": x_leaf, "cos_leaf": cos_leaf, "sin_leaf": sin_leaf, "covered": covered}


def _chain_sig(leaf: tuple[str, list[Node]]) -> tuple:
    return (leaf[0], tuple((v.op, repr(v.args[1:])) for v in leaf[1]))


def _half_of(graph: Graph, ref: Any) -> tuple | None:
    """(the sliced value's view chain, start, end) for a last-dim slice ``x[..., start:end]`` of a leaf."""
    node = graph.node(ref.name) if isinstance(ref, Ref) else None
    if node is None or node.op != "slice" or len(node.args) < 3:
        return None
    src = graph.type_of(node.args[0].name) if isinstance(node.args[0], Ref) else None
    if src is None or node.args[1] not in (-1, len(src.shape) - 1) or (len(node.args) > 4 and node.args[4] != 1):
        return None
    leaf = leaf_of(graph, node.args[0])
    if leaf is None:
        return None
    end = node.args[3] if len(node.args) > 3 and node.args[3] is not None else src.shape[-1]
    return _chain_sig(leaf), node.args[2], min(end, src.shape[-1])


def _is_rope(graph: Graph) -> dict[str, Any] | None:
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


def _attention_match(graph: Graph) -> dict[str, Any] | None:
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
        if n.op == "permute" and not reshaped:
            perm = [perm[i] for i in n.args[1]]
        elif n.op in ("view", "_unsafe_view", "reshape", "clone", "alias"):
            reshaped = True
        else:
            return None
        down = n.name
    if graph.outputs[0].name != down:
        return None
    return {"q": qsrc, "k": kv[0], "v": kv[1], "B": B, "H": H, "HK": HK, "TQ": TQ, "D": D, "scale": scale,
            "perm": perm, "out": down}


def _matmul_match(graph: Graph) -> dict[str, Any] | None:
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


def _values_only(graph: Graph, n: Node) -> str | None:
    """For max.dim / min.dim: the dtype of the values, where the graph returns only them (``torch.max(x, d)[0]``)."""
    uses = [u for u in graph.nodes if any(isinstance(x, Ref) and x.name == n.name for x in u.args)]
    outs = [o.name for o in graph.outputs if isinstance(o, Ref)]
    if len(uses) != 1 or uses[0].op != "getitem" or uses[0].args[1] != 0 or outs != [uses[0].name]:
        return None
    t = graph.type_of(uses[0].name)
    return t.dtype if t is not None else None


def _reduction_match(graph: Graph) -> dict[str, Any] | None:
    comp = graph.compute_nodes()
    if len(comp) != 1 or comp[0].op not in ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin"):
        return None
    n = comp[0]
    src = n.args[0]
    if not isinstance(src, Ref) or not src.name.startswith("p"):
        return None
    t = graph.type_of(src.name)
    dims = n.args[1] if len(n.args) > 1 else None
    op = n.op
    out_dtype = n.type.dtype if n.type else "float32"
    if op in ("max", "min"):  # max.dim / min.dim: values and indices; only the values may be used
        vdt = _values_only(graph, n) if isinstance(dims, int) else None
        if vdt is None:
            return None
        op, dims, out_dtype = "a" + op, [dims], vdt
    elif op in ("argmax", "argmin"):  # over one dim only; over the flattened tensor (dim=None) is another shape
        if not isinstance(dims, int):
            return None
        dims = [dims]
    if t is None or not isinstance(dims, list) or len(dims) != 1 or not t.shape:
        return None
    dim = dims[0] % len(t.shape)
    keep = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    if not all(v.op in ("getitem", "alias") for v in graph.nodes if v.op in VIEW_OPS):
        return None
    return {"op": op, "x": src.name, "dim": dim, "keepdim": keep, "out_dtype": out_dtype}


# aten pooling op -> (kind, spatial dims). The 1-d pools reach aten as 2-d ones over an unsqueezed input.
POOLS = {"max_pool2d_with_indices": ("max", 2), "max_pool3d_with_indices": ("max", 3),
         "avg_pool2d": ("avg", 2), "avg_pool3d": ("avg", 3)}
_POOL_VIEWS = frozenset({"unsqueeze", "squeeze", "getitem", "alias"})


def _per_dim(v: Any, nd: int, default: int) -> list[int] | None:
    """A pooling argument (an int, a list of one, or one per dim; empty means ``default``) as one int per dim."""
    if v is None or v == []:
        return [default] * nd
    if isinstance(v, int):
        return [v] * nd
    if isinstance(v, list) and all(isinstance(x, int) for x in v) and len(v) in (1, nd):
        return list(v) * (nd // len(v))
    return None


def _pool_match(graph: Graph) -> dict[str, Any] | None:
    """One max or average pool of a float input, seen through the views that add or drop size-1 dims (how the
    1-d pools reach aten); for a max pool only its values may be used, not the indices."""
    comp = graph.compute_nodes()
    if len(comp) != 1 or comp[0].op not in POOLS or len(graph.placeholders) != 1 or len(graph.outputs) != 1:
        return None
    n = comp[0]
    kind, nd = POOLS[n.op]
    if any(v.op not in _POOL_VIEWS for v in graph.nodes if v is not n):
        return None
    x_t, out_ref = graph.placeholders[0][1], graph.outputs[0]
    in_t = graph.type_of(n.args[0].name) if isinstance(n.args[0], Ref) else None
    out_t = graph.type_of(out_ref.name) if isinstance(out_ref, Ref) else None
    if x_t is None or in_t is None or out_t is None or x_t.dtype not in _FLOATS or len(in_t.shape) < nd + 1:
        return None
    if any(v.op == "getitem" and v.refs() == [n.name] and v.args[1] != 0 for v in graph.nodes):
        return None  # the max pool's indices are used
    names = ["kernel_size", "stride", "padding"] + (["dilation", "ceil_mode"] if kind == "max" else
                                                    ["ceil_mode", "count_include_pad", "divisor_override"])
    args = dict(zip(names, n.args[1:]))
    args.update({k: v for k, v in n.kwargs.items() if k in names})
    kernel = _per_dim(args.get("kernel_size"), nd, 1)
    stride = _per_dim(args.get("stride"), nd, 1) if args.get("stride") not in (None, []) else kernel
    padding = _per_dim(args.get("padding", 0), nd, 0)
    dilation = _per_dim(args.get("dilation", 1), nd, 1)
    if kernel is None or stride is None or padding is None or dilation is None:
        return None
    pooled = n.out[0]
    if pooled is None or pooled.numel != out_t.numel or x_t.numel != in_t.numel:
        return None
    return {"kind": kind, "nd": nd, "x": graph.placeholders[0][0], "kernel": kernel, "stride": stride,
            "padding": padding, "dilation": dilation, "in_spatial": in_t.shape[-nd:],
            "out_spatial": pooled.shape[-nd:], "out_shape": out_t.shape, "dtype": x_t.dtype,
            "count_include_pad": bool(args.get("count_include_pad", True)),
            "divisor_override": args.get("divisor_override")}


_GROUP_NORM_VIEWS = frozenset({"getitem", "view", "_unsafe_view", "reshape", "alias"})


def _group_norm_match(graph: Graph) -> dict[str, Any] | None:
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
    if x_t is None or out_t is None or x_t.dtype not in _FLOATS or out_t.numel != x_t.numel or not x_t.numel:
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


TOTAL_REDUCTIONS = ("sum", "mean", "linalg_vector_norm")
_FLOATS = ("float32", "bfloat16", "float16")


def _norm_order(n: Node) -> Any:
    """The ord of a ``linalg_vector_norm`` (2 where the graph leaves it out), None for other ops."""
    if n.op != "linalg_vector_norm":
        return None
    return n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2)


def _downstream(comp: list[Node], start: str, skip: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """``start`` and the compute nodes (in ``comp``, topologically ordered) that read it, transitively."""
    after = {start}
    for n in comp:
        if n.name not in skip and set(n.refs()) & after:
            after.add(n.name)
    return after


def _in_order(comp: list[Node], names: set[str]) -> list[str]:
    return [n.name for n in comp if n.name in names]


def _views_are_leaves(graph: Graph, skip: set[str] | frozenset[str] = frozenset()) -> bool:
    """Every view node (but those in ``skip``) lies between a placeholder and its use."""
    return all(n.op not in VIEW_OPS or n.name in skip or (n.op in LEAF_VIEW_OPS and leaf_of(graph, Ref(n.name)))
               for n in graph.nodes)


def _reduces_everything(n: Node, ndim: int) -> bool:
    """Whether ``n`` (sum, mean, or a 1- or 2-norm, with no dtype argument) reduces every dim of its input."""
    if n.kwargs.get("dtype") is not None:
        return False
    if n.op == "linalg_vector_norm":
        if _norm_order(n) not in (1, 2):
            return False
        dims = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim")
    else:
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if dims is None or dims == []:
        return True
    dims = [dims] if isinstance(dims, int) else dims
    return isinstance(dims, list) and all(isinstance(d, int) for d in dims) and \
        sorted(d % ndim for d in dims) == list(range(ndim))


def _upstream(graph: Graph, names: list[str], stop: set[str]) -> set[str]:
    """The compute nodes that ``names`` read, transitively, without walking into ``stop`` or views (leaves)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        node = graph.node(todo.pop())
        if node is None or node.op in VIEW_OPS:
            continue
        for r in node.refs():
            dep = graph.node(r)
            if dep is not None and dep.op not in VIEW_OPS and r not in stop and r not in seen:
                seen.add(r)
                todo.append(r)
    return seen


def _total_match(graph: Graph) -> dict[str, Any] | None:
    """One reduction of a whole float value to a scalar (sum, mean, 1- or 2-norm) with pointwise work around it:
    a prologue over the inputs, broadcast into the reduced shape (a loss's differences); a scalar epilogue (the
    batch division of a batchmean); or a full-shape epilogue that reads the scalar (``x / ||x||``).

    The node lists are the three kernels' work: ``prologue`` feeds the partial sums, ``finish`` runs on the
    scalar, ``apply`` writes the full-shape output."""
    comp = graph.compute_nodes()
    reds = [n for n in comp if not is_pointwise(n)]
    if len(reds) != 1 or reds[0].op not in TOTAL_REDUCTIONS:
        return None
    red = reds[0]
    src = red.args[0] if red.args else None
    ts = graph.type_of(src.name) if isinstance(src, Ref) else None
    if ts is None or not ts.shape or ts.dtype not in _FLOATS or not _reduces_everything(red, len(ts.shape)):
        return None
    if len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref) or not _views_are_leaves(graph):
        return None
    out = graph.outputs[0].name
    prologue = _upstream(graph, [red.name], set())
    names = {n.name: n for n in comp}
    after = _downstream(comp, red.name)
    scalar = {m for m in after - {red.name} if names[m].type is not None and names[m].type.numel == 1}
    finish = scalar | {c for m in scalar for c in names[m].refs() if c in names and not names[c].refs()}
    for m in finish:
        if any(r not in finish and r != red.name for r in names[m].refs()):
            return None
    if out == red.name or out in finish:
        apply: set[str] = set()
    else:
        apply = _upstream(graph, [out], finish | {red.name}) - finish - {red.name} | {out}
    if set(names) != prologue | {red.name} | finish | apply:
        return None
    return {"red": red.name, "src": src.name, "ord": _norm_order(red), "prologue": _in_order(comp, prologue),
            "finish": _in_order(comp, finish), "apply": _in_order(comp, apply), "out": out}


SCANS = {"cumsum": 0.0, "cumprod": 1.0}


def _sole_user(graph: Graph, name: str) -> Node | None:
    users = [n for n in graph.nodes if name in n.refs()]
    return users[0] if len(users) == 1 else None


def _exclusive_head(graph: Graph, scan: Node, dim: int) -> tuple[str, set[str]] | None:
    """``cat([identity, scan(x[..., :-1])], dim)``, the way torch code writes an exclusive scan: x's name and the
    nodes of the pattern, or None. The identity part (zeros for a sum, ones for a product) is one wide along dim."""
    sl = graph.node(scan.args[0].name) if isinstance(scan.args[0], Ref) else None
    cat = _sole_user(graph, scan.name)
    if sl is None or sl.op != "slice" or cat is None or cat.op != "cat" or not isinstance(sl.args[0], Ref):
        return None
    xt = graph.type_of(sl.args[0].name)
    if xt is None:
        return None
    n = xt.shape[dim]
    s_dim, start, end = (list(sl.args[1:4]) + [None, None, None])[:3]
    step = sl.args[4] if len(sl.args) > 4 else 1
    if s_dim is None or s_dim % len(xt.shape) != dim or start not in (0, None) or step != 1 \
            or end not in (n - 1, -1):
        return None
    parts, cdim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
    if not isinstance(parts, list) or len(parts) != 2 or cdim % len(xt.shape) != dim or parts[1] != Ref(scan.name):
        return None
    ident = graph.node(parts[0].name) if isinstance(parts[0], Ref) else None
    it = ident.type if ident is not None else None
    if ident is None or it is None or ident.op not in ("full", "full_like") or it.shape[dim] != 1:
        return None
    value = ident.args[1] if len(ident.args) > 1 else None
    if value != SCANS[scan.op]:
        return None
    return sl.args[0].name, {sl.name, cat.name, ident.name} | _upstream_views(graph, ident)


def _upstream_views(graph: Graph, node: Node) -> set[str]:
    """The view nodes a node reads (a ``full_like`` only reads a shape)."""
    out: set[str] = set()
    todo = list(node.refs())
    while todo:
        v = graph.node(todo.pop())
        if v is not None and v.op in VIEW_OPS:
            out.add(v.name)
            todo += v.refs()
    return out


def _scan_match(graph: Graph) -> dict[str, Any] | None:
    """One cumulative sum or product of a float value over one dim, read forwards, backwards (between two flips
    of that dim) or exclusively (``cat([0, cumsum(x[..., :-1])])``), with pointwise work before and after it."""
    comp = graph.compute_nodes()
    scans = [n for n in comp if n.op in SCANS]
    if len(scans) != 1 or len(graph.outputs) != 1 or not isinstance(graph.outputs[0], Ref):
        return None
    scan = scans[0]
    src = scan.args[0] if scan.args else None
    st = graph.type_of(src.name) if isinstance(src, Ref) else None
    if st is None or not st.shape or st.dtype not in _FLOATS or scan.kwargs.get("dtype") is not None or len(scan.args) < 2 or not isinstance(scan.args[1], int):
        return None
    dim = scan.args[1] % len(st.shape)
    head, tail, covered, reverse, exclusive = src.name, scan.name, {scan.name}, False, False
    first = graph.node(src.name)
    if first is not None and first.op == "flip":
        last = _sole_user(graph, scan.name)
        if last is None or last.op != "flip" or _sole_user(graph, first.name) is not scan:
            return None
        if [d % len(st.shape) for d in first.args[1]] != [dim] or [d % len(st.shape) for d in last.args[1]] != [dim]:
            return None
        head, tail, reverse = first.args[0].name, last.name, True
        covered |= {first.name, last.name}
    elif first is not None and first.op == "slice":
        ex = _exclusive_head(graph, scan, dim)
        if ex is None:
            return None
        head, ex_nodes = ex
        tail = next(n for n in ex_nodes if graph.node(n).op == "cat")
        covered |= ex_nodes
        exclusive = True
    out = graph.outputs[0].name
    hn = graph.node(head)
    prologue = _upstream(graph, [head], set()) | ({head} if hn is not None and hn.op not in VIEW_OPS else set())
    epilogue = _downstream(comp, tail, covered) - {tail}
    names = {n.name for n in comp}
    if names - covered - prologue - epilogue or not all(is_pointwise(graph.node(n)) for n in prologue | epilogue):
        return None
    if out != tail and out not in epilogue or not _views_are_leaves(graph, covered):
        return None
    return {"op": scan.op, "dim": dim, "head": head, "tail": tail, "reverse": reverse, "exclusive": exclusive,
            "prologue": _in_order(comp, prologue), "epilogue": _in_order(comp, epilogue), "out": out}


def _pointwise_match(graph: Graph) -> dict[str, Any] | None:
    comp = graph.compute_nodes()
    if not comp or not all(is_pointwise(n) for n in comp):
        return None
    for n in graph.nodes:
        if n.op in VIEW_OPS and n.op not in ("getitem",) and n.op not in LEAF_VIEW_OPS:
            return None
    # Views are only allowed on the way from a placeholder into the chain.
    for n in graph.nodes:
        if n.op in LEAF_VIEW_OPS and leaf_of(graph, Ref(n.name)) is None:
            return None
    if not all(isinstance(o, Ref) and graph.node(o.name) is not None for o in graph.outputs):
        return None
    shapes = {tuple(graph.type_of(o.name).shape) for o in graph.outputs if graph.type_of(o.name)}
    if len(shapes) != 1:
        return None
    return {"outputs": [o.name for o in graph.outputs]}


# The matchers classify tries, in order, before and after the row-wise families; the first that matches names the
# family.
_BEFORE_ROWS = (("matmul", _matmul_match), ("attention", _attention_match), ("cross_entropy", _is_cross_entropy),
                ("rope", _is_rope))
_AFTER_ROWS = (("reduction", _reduction_match), ("total", _total_match), ("scan", _scan_match),
               ("pool", _pool_match), ("group_norm", _group_norm_match))


def _first_match(graph: Graph, matchers: tuple[tuple[str, Any], ...]) -> tuple[str, dict[str, Any]] | None:
    for family, match in matchers:
        if (m := match(graph)) is not None:
            return family, m
    return None


def classify(problem: Problem) -> FamilyMatch | None:
    """Classify a problem, or None where no template covers it (then the LLM writes the first seed)."""
    graph = parse_graph(problem.graph_text)
    ops = set(graph.ops())
    family: str | None = None
    attrs: dict[str, Any] = {}
    if not graph.nodes:
        return None
    if (hit := _first_match(graph, _BEFORE_ROWS)) is not None:
        family, attrs = hit
    elif (dims := _row_dims(graph)) is not None:
        if ops & {"_softmax", "_log_softmax"} and len(ops - {"_to_copy"}) == 1:
            family = "log_softmax" if "_log_softmax" in ops else "softmax"
        elif "native_layer_norm" in ops or ({"mean", "sub"} <= ops and ops & {"var", "pow"}
                                             and ops & {"rsqrt", "sqrt", "div"}):
            family = "layernorm"
        elif "mean" in ops and ops & {"rsqrt", "sqrt"} and ops & {"pow", "mul"}:
            family = "rmsnorm"
        elif {"amax", "exp", "sum"} <= ops:
            family = "softmax"
        else:
            family = "rowwise"
        attrs = {"dims": list(dims)}
    elif (hit := _first_match(graph, _AFTER_ROWS)) is not None:
        family, attrs = hit
    elif (m := _pointwise_match(graph)) is not None:
        act = ops & {"sigmoid", "gelu", "tanh", "silu", "relu"}
        muls = [n for n in graph.compute_nodes() if n.op == "mul" and len(n.args) == 2
                and all(isinstance(a, Ref) for a in n.args)]
        family = "act_mul" if act and muls and len(graph.outputs) == 1 else "pointwise"
        attrs = m
    if family is None:
        return None
    return _with_state(family, problem, graph, attrs)


def _with_state(family: str, problem: Problem, graph: Graph, attrs: dict[str, Any]) -> FamilyMatch | None:
    """The match, with Model's parameters and constructor read; None where Model cannot be built (user code: no
    seed then, not a crash) or holds more tensors than the graph takes."""
    try:
        state, sig = model_state(problem)
    except Exception as e:  # noqa: BLE001
        log.warning("could not read the parameters of %s: %s", problem.name, e)
        return None
    if len(state) > len(graph.placeholders):
        return None
    return FamilyMatch(family, problem, graph, state, sig, attrs)


# The family of a problem no op-family template covers: its seeds come from Inductor's kernels alone.
GENERIC = "inductor"


def generic_match(problem: Problem) -> FamilyMatch | None:
    """A match with no op-family template: the graph, Model's state and constructor, so that Inductor's kernels
    can be rendered as a candidate. None where the graph is empty or Model cannot be built."""
    graph = parse_graph(problem.graph_text)
    return _with_state(GENERIC, problem, graph, {}) if graph.nodes else None


def family_of(problem: Problem) -> str | None:
    """The op family a template covers for this problem, or None."""
    m = classify(problem)
    return m.family if m else None
