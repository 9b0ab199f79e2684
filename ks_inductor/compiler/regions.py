"""Dynamo FX graph → regions → Problems.

A *region* is a convex set of nodes of the graph Dynamo hands the backend: an anchor (mm/addmm/bmm, convolution,
attention) with its pointwise prologue and epilogue, a norm, a softmax, another reduction with the pointwise
work around it, or a chain of pointwise operations.

Why regions are cut on the Dynamo graph but judged on aten: every Dynamo node is traced to core-aten (the same
decomposition table :func:`ks_inductor.problem_tracing.problem_from_callable` uses) to decide what it *is* (an anchor, a
reduction, pointwise, a view, or something no kernel covers); the region's nodes are then copied into a small
callable whose parameters (weights included) are its inputs, and that callable becomes a :class:`Problem` whose
canonical key is computed by :mod:`ks_inductor.keys`, exactly as for a KernelBench file given to ``evolve``.
Keeping the boundaries on Dynamo nodes lets the backend swap a hit in the graph it gives to Inductor's
``compile_fx`` (the rewritten graph is what Inductor's caches key on, see research note C §0.3 A), while the rest
of the graph reaches Inductor untouched, so a model without hits compiles exactly as under ``inductor``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import operator
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

import ks_inductor.canonical_ops
import ks_inductor.keys
import ks_inductor.problem_tracing
from ks_inductor.compiler.analysis_memo import AnalysisMemo, analysis_salt
from ks_inductor.problem_tracing import op_label

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)

KIND_MATMUL = "matmul"
KIND_CONV = "conv"
KIND_ATTENTION = "attention"
KIND_NORM = "norm"
KIND_SOFTMAX = "softmax"
KIND_REDUCTION = "reduction"
KIND_POINTWISE = "pointwise"

# Node classes (per Dynamo node, from its aten trace).
_ANCHOR, _REDUCTION, _POINTWISE, _VIEW, _OTHER = "anchor", "reduction", "pointwise", "view", "other"

_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "addbmm", "_int_mm"})
_CONV_OPS = frozenset({"convolution", "_convolution", "conv2d", "conv1d", "conv3d"})
_REDUCTION_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "prod", "_softmax", "_log_softmax",
    "logsumexp", "linalg_vector_norm", "native_layer_norm", "native_group_norm", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    # Not tagged reductions by aten, but each output reads a window or a prefix of the input: Inductor emits them
    # as Triton reduction, scan or windowed pointwise kernels, so they make regions of their own.
    "argmax", "argmin", "cumsum", "cumprod", "logcumsumexp", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "_low_memory_max_pool_with_offsets", "_low_memory_max_pool_offsets_to_indices",
})
_VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "permute", "t", "transpose", "unsqueeze", "squeeze", "slice",
    "select", "alias", "detach", "as_strided", "split", "split_with_sizes", "unbind", "lift_fresh_copy",
    "unfold", "view_as", "expand_as",
})
# Not tagged pointwise by aten, but elementwise in what they read and write (Inductor lowers them so, too).
_POINTWISE_EXTRA = frozenset({"_to_copy", "clone", "cat", "full", "scalar_tensor", "full_like", "zeros_like",
                              "ones_like", "empty_like", "fill", "where", "copy", "constant_pad_nd", "arange",
                              "iota", "zeros", "ones", "empty", "empty_strided", "embedding", "index_select",
                              "gather", "index"})
_NORM_MARKERS = frozenset({"rsqrt", "native_layer_norm", "native_group_norm", "var_mean", "var",
                           "native_batch_norm", "_native_batch_norm_legit_no_training", "linalg_vector_norm"})

MAX_REGION_NODES = 96

# How often this process traced a Dynamo node or a region to aten (the analysis' expensive steps): what the
# memos save shows here.
COUNTERS: collections.Counter[str] = collections.Counter()


@dataclass
class Region:
    """A convex group of Dynamo nodes that becomes one problem (and, on a hit, one kernel call)."""

    index: int
    kind: str
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    ops: list[str]
    symbolic: bool = False
    device: str = "cpu"
    signature: str = ""  # cheap structural hash: equal for repeated layers, memoizes problem building
    problem: Problem | None = None  # filled by region_problem()
    error: str | None = None
    # The signature names every node by what it is, not where it lives in memory: it may be kept across processes.
    stable: bool = False
    memo: AnalysisMemo | None = field(default=None, repr=False)
    traced: bool = False  # region_problem() traced it (no memo had its problem)

    @property
    def op_text(self) -> str:
        return "+".join(self.ops)


@dataclass
class Partition:
    regions: list[Region] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)  # ops no region could take (for explain)
    memo: AnalysisMemo | None = field(default=None, repr=False)  # the graph's on-disk analysis, when it may have one
    traced_nodes: int = 0  # nodes traced to aten by this partition (the rest came from a memo)


def _analysis_code() -> tuple[ModuleType, ...]:
    """The modules whose code decides a graph's analysis: a memo made by other code is stale."""
    return (sys.modules[__name__], ks_inductor.problem_tracing, ks_inductor.keys, ks_inductor.canonical_ops)


def save_analysis(part: Partition) -> None:
    """Keep what this graph's analysis computed for the next process; failures only cost the next one time."""
    if part.memo is None:
        return
    try:
        part.memo.save()
    except Exception as e:  # noqa: BLE001
        log.debug("could not keep the analysis memo at %s: %s", part.memo.path, e)


# ----------------------------------------------------------------------------------------- values and hints


def _hint(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        h = v.node.hint
        if h is None:
            raise ValueError(f"no hint for symbolic size {v}")
        return int(h)
    if isinstance(v, torch.SymFloat):
        return float(v.node.hint)
    if isinstance(v, torch.SymBool):
        return bool(v.node.hint)
    return v


def _is_symbolic(v: Any) -> bool:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))
    return False


def example_value(node: fx.Node) -> Any:
    """The value Dynamo recorded for a node (a FakeTensor, a SymInt, a tuple...)."""
    if "example_value" in node.meta:
        return node.meta["example_value"]
    return node.meta.get("val")


class _Concretizer:
    """Makes concrete-shape fake tensors (at the symbols' hints) in one private fake mode."""

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.mode = FakeTensorMode(allow_non_fake_inputs=True)

    def __call__(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            shape = [_hint(s) for s in v.shape]
            stride = [_hint(s) for s in v.stride()]
            with self.mode:
                t = torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device)
            if v.requires_grad and (v.dtype.is_floating_point or v.dtype.is_complex):
                t.requires_grad_(False)
            return t
        if isinstance(v, (list, tuple)):
            return type(v)(self(x) for x in v)
        return _hint(v)


# ----------------------------------------------------------------------------------------- node classification


def _run_node(node: fx.Node, args: tuple, kwargs: dict, root: torch.nn.Module) -> Any:
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        self_obj, *rest = args
        return getattr(self_obj, node.target)(*rest, **kwargs)
    if node.op == "call_module":
        return root.get_submodule(node.target)(*args, **kwargs)
    raise ValueError(node.op)


def _op_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _aten_ops(node: fx.Node, root: torch.nn.Module, conc: _Concretizer) -> list[Any] | None:
    """The aten ops one Dynamo node decomposes to, or None when it cannot be traced on fake inputs."""

    from ks_inductor.problem_tracing import trace_aten

    leaves: list[Any] = []

    def lift(a: Any) -> Any:
        if isinstance(a, fx.Node):
            v = conc(example_value(a))
            if isinstance(v, torch.Tensor):
                leaves.append(v)
                return ("__leaf__", len(leaves) - 1)
            return v
        return a

    args = fx.node.map_aggregate(node.args, lift)
    kwargs = fx.node.map_aggregate(node.kwargs, lift)

    def put(a: Any, ts: Sequence[Any]) -> Any:
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "__leaf__":
            return ts[a[1]]
        if isinstance(a, (list, tuple)):
            return type(a)(put(x, ts) for x in a)
        if isinstance(a, dict):
            return {k: put(x, ts) for k, x in a.items()}
        return a

    def fn(*ts: Any) -> Any:
        return _run_node(node, put(args, ts), put(kwargs, ts), root)

    try:
        gm = trace_aten(fn, *leaves)
    except Exception as e:  # noqa: BLE001 - an untraceable node is simply not part of any region
        log.debug("node %s not traceable to aten: %s", node.format_node(), e)
        return None
    return [_unannotated_mutation(n) or n.target for n in gm.graph.nodes if n.op == "call_function"]


def batch_norm_updating_running_stats(*args: Any) -> None:
    """Stands in for a training-mode ``native_batch_norm`` among a node's ops (never called)."""
    raise NotImplementedError


# Why an op that no region takes stays with Inductor, where a reason more specific than "no region takes it" exists.
_RANDOM_WHY = ("draws random numbers, which no kernel can be checked against (its stream differs from the "
               "reference's); Inductor keeps it, and the operations around it form regions of their own that take "
               "its numbers as inputs")
UNSUPPORTED_WHY = {
    "batch_norm_updating_running_stats": "training-mode batch norm updates its running statistics in place, which a "
                                         "region's kernel (a function of its inputs) cannot; Inductor keeps it",
    **{op: _RANDOM_WHY for op in ("rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
                                  "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "exponential_",
                                  "multinomial", "native_dropout", "poisson", "random_", "geometric_", "cauchy_",
                                  "log_normal_")},
}


def _unannotated_mutation(n: fx.Node) -> Any:
    """A stand-in for an op that writes to an input without saying so in its schema, else None.
    ``native_batch_norm`` in training mode updates ``running_mean`` and ``running_var`` in place, but its schema
    declares no mutation: a region made of it would be judged on its output alone, and a kernel that leaves the
    running statistics alone would pass and be served."""
    if _op_name(n.target) == "native_batch_norm" and len(n.args) > 5 and n.args[5] is True and n.args[3] is not None:
        return batch_norm_updating_running_stats
    return None


def _classify_ops(ops: list[Any]) -> tuple[str, str | None]:
    """(class, anchor kind) of a node from its aten ops."""
    if not ops:
        return _VIEW, None
    cls = _VIEW
    anchor: str | None = None
    for op in ops:
        if op is operator.getitem:
            continue
        name = _op_name(op)
        schema = getattr(op, "_schema", None)
        if schema is not None and schema.is_mutable:
            return _OTHER, None
        if name in _MATMUL_OPS:
            anchor = anchor or KIND_MATMUL
        elif name in _CONV_OPS:
            anchor = KIND_CONV
        elif "attention" in name or name == "sdpa":  # sdpa: kernelsmith::sdpa, see canonical_ops
            anchor = KIND_ATTENTION
        elif name in _REDUCTION_OPS or (hasattr(torch.Tag, "reduction") and torch.Tag.reduction in getattr(op, "tags", ())):
            cls = _REDUCTION if cls != _OTHER else cls
        elif name in _VIEW_OPS:
            continue
        elif torch.Tag.pointwise in getattr(op, "tags", ()) or name in _POINTWISE_EXTRA:
            cls = cls if cls in (_REDUCTION, _OTHER) else _POINTWISE
        else:
            return _OTHER, None
    if anchor:
        return _ANCHOR, anchor
    return cls, None


# ----------------------------------------------------------------------------------------- partition


class _Graph:
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def reaches(self, sources: Sequence[fx.Node], targets: set[fx.Node], limit: int) -> bool:
        """Whether any of ``sources`` reaches a node of ``targets`` along data edges (topo index <= limit)."""
        seen: set[fx.Node] = set()
        stack = list(sources)
        while stack:
            n = stack.pop()
            if n in targets:
                return True
            if n in seen or self.order[n] > limit:
                continue
            seen.add(n)
            stack.extend(n.users)
        return False


def _compute_nodes(ops_of: dict[fx.Node, list[str]], nodes: Sequence[fx.Node]) -> int:
    return sum(1 for n in nodes if any(o not in _VIEW_OPS for o in ops_of.get(n, [])))


def partition(gm: fx.GraphModule) -> Partition:
    """Split a Dynamo graph into regions (no problems built yet; see :func:`region_problem`)."""
    conc: _Concretizer | None = None
    cls: dict[fx.Node, str] = {}
    anchor_kind: dict[fx.Node, str | None] = {}
    ops_of: dict[fx.Node, list[str]] = {}
    local_memo: dict[str, tuple[list[str], str, str | None]] = {}
    out = Partition()
    sigs: dict[fx.Node, tuple[str, bool]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        val = example_value(node)
        # A tuple of tensors (chunk, split, unbind) may join a region as a view; other tuples, shape arithmetic and
        # sparse or quantized values never do.
        vals = list(val) if isinstance(val, (tuple, list)) and val else [val]
        if not all(isinstance(v, torch.Tensor) and not v.is_sparse and not v.is_quantized and _dense_device(v)
                   for v in vals):
            cls[node] = _OTHER
            continue
        sigs[node] = _node_signature(node)
    if sigs and all(stable for _, stable in sigs.values()):
        out.memo = AnalysisMemo.load("\n".join(sig for sig, _ in sigs.values()), analysis_salt(_analysis_code()))
    for node, (sig, stable) in sigs.items():
        # Tracing a node is what the analysis spends its time on; a signature names the node's function, its
        # arguments' dtypes, shapes and strides, so equal signatures trace to the same aten ops.
        memo = _NODE_MEMO if stable else local_memo
        entry = memo.get(sig)
        if entry is None and out.memo is not None:
            entry = out.memo.node(sig)
        if entry is None:
            conc = conc or _Concretizer()
            ops = _aten_ops(node, gm, conc)
            out.traced_nodes += 1
            COUNTERS["node_traces"] += 1
            if ops is None:
                entry = ([], _OTHER, None)
            else:
                entry = ([_op_name(o) for o in ops if o is not operator.getitem], *_classify_ops(ops))
        memo[sig] = entry
        if out.memo is not None:
            out.memo.put_node(sig, entry)
        ops_of[node], cls[node], anchor_kind[node] = list(entry[0]), entry[1], entry[2]
        if isinstance(example_value(node), (tuple, list)) and cls[node] != _VIEW and not _values_and_indices(
                node, ops_of[node], cls[node]):
            cls[node] = _OTHER  # a tuple-valued computation (var_mean, topk) is cut at its getitems, not inside
        if cls[node] == _OTHER:
            out.unsupported.append("+".join(n for n in ops_of[node] if n not in _VIEW_OPS)
                                   or op_label(node.target))

    g = _Graph(gm)
    claimed: dict[fx.Node, int] = {}
    groups: list[tuple[str, list[fx.Node]]] = []

    def grow(seed: fx.Node, allow: set[str], prologue_private: bool) -> list[fx.Node]:
        members = {seed}
        gid = len(groups)
        claimed[seed] = gid
        changed = True
        while changed and len(members) < MAX_REGION_NODES:
            changed = False
            for n in sorted(members, key=g.order.__getitem__):
                for p in n.all_input_nodes:
                    if p in claimed or cls.get(p) not in allow:
                        continue
                    others = [u for u in p.users if u not in members]
                    if prologue_private and others:
                        continue
                    limit = max(g.order[m] for m in members)
                    if others and g.reaches(others, members, limit):
                        continue  # p -> outside -> region: adding p would make a cycle
                    members.add(p)
                    claimed[p] = gid
                    changed = True
                for c in list(n.users):
                    if c in claimed or cls.get(c) not in allow:
                        continue
                    outside = [a for a in c.all_input_nodes if a not in members]
                    if outside and g.reaches(list(members), set(outside), g.order[c]):
                        continue  # region -> outside -> c
                    members.add(c)
                    claimed[c] = gid
                    changed = True
        nodes = sorted(members, key=g.order.__getitem__)
        return nodes

    call_nodes = [n for n in gm.graph.nodes if n in cls]
    # Reductions first: norms and softmax take the pointwise work on both sides of them (residual adds, casts,
    # scales). Attention next, so the key/value concatenation with a cache and the rotary embedding on q and k
    # become its prologue: fused there, the cache is read once instead of copied first. Other anchors then take
    # what is left as epilogue; leftover pointwise chains last.
    for n in call_nodes:
        if cls[n] == _REDUCTION and n not in claimed:
            groups.append(("reduction", grow(n, {_REDUCTION, _POINTWISE, _VIEW}, prologue_private=False)))
    for n in call_nodes:
        if cls[n] == _ANCHOR and anchor_kind[n] == KIND_ATTENTION and n not in claimed:
            groups.append((KIND_ATTENTION, grow(n, {_POINTWISE, _VIEW}, prologue_private=True)))
    for n in call_nodes:
        if cls[n] == _ANCHOR and n not in claimed:
            groups.append((anchor_kind[n] or KIND_MATMUL, grow(n, {_POINTWISE, _VIEW}, prologue_private=True)))
    for n in call_nodes:
        if cls[n] == _POINTWISE and n not in claimed:
            groups.append((KIND_POINTWISE, grow(n, {_POINTWISE, _VIEW}, prologue_private=False)))

    for kind, nodes in sorted(groups, key=lambda kn: g.order[kn[1][0]]):
        compute = _compute_nodes(ops_of, nodes)
        if compute == 0:
            continue
        # A lone pointwise op makes a region too (a model that is one activation has nothing else): Inductor's own
        # kernel seeds it, and a kernel is served only where the judge and the graph guard find it faster.
        region = _make_region(len(out.regions), kind, nodes, ops_of, sigs)
        if region is not None:
            region.memo = out.memo if region.stable else None
            out.regions.append(region)
    return out


# Reductions that return (values, indices): one Triton reduction kernel in Inductor, so the region takes the node with
# its getitems. Other tuple-valued computations (var_mean inside a norm, topk) stay cut at their getitems.
_VALUES_AND_INDICES = frozenset({"max", "min"})


def _values_and_indices(node: fx.Node, ops: list[str], node_cls: str) -> bool:
    return (node_cls == _REDUCTION and bool(ops) and set(ops) <= _VALUES_AND_INDICES and bool(node.users)
            and all(u.op == "call_function" and u.target is operator.getitem for u in node.users))


def _dense_device(v: torch.Tensor) -> bool:
    return v.device.type in ("cpu", "cuda") and v.layout == torch.strided


# Functions whose meaning is fixed by the torch version (which the on-disk memo is keyed by). A user function, a
# custom op outside these namespaces or a module call may change between processes under the same name.
_PINNED_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_PINNED_NAMESPACES = frozenset({"aten", "prims", "kernelsmith"})


def _qualified_name(target: Any) -> str | None:
    """``module.name`` for a function of a pinned module that resolves back to ``target``, else None."""
    mod = getattr(target, "__module__", None)
    if not isinstance(mod, str) or not any(mod == p or mod.startswith(p + ".") for p in _PINNED_MODULES):
        return None
    base = sys.modules.get(mod)
    for attr in (getattr(target, "__qualname__", None), getattr(target, "__name__", None)):
        if base is None or not isinstance(attr, str) or "<" in attr:
            continue
        obj: Any = base
        for part in attr.split("."):
            obj = getattr(obj, part, None)
        if obj is target:
            return f"{mod}.{attr}"
    return None


def _target_text(node: fx.Node) -> tuple[str, bool]:
    """(text naming what the node calls, whether that text means the same in another process)."""
    t = node.target
    if node.op == "call_method":
        return f"method:{t}", True
    if node.op == "call_module":
        # The module's attributes (eps, ...) are not in the node: its identity stands in for them.
        try:
            mod = node.graph.owning_module.get_submodule(str(t))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no module to name: the target's text alone, as a local name
            mod = None
        return f"module:{t}:{type(mod).__qualname__}@{id(mod):x}", False
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"op:{t}", str(t).split(".", 1)[0] in _PINNED_NAMESPACES
    name = _qualified_name(t)
    if name is not None:
        return f"fn:{name}", True
    return f"obj:{t!r}@{id(t):x}", False


def value_text(v: Any) -> tuple[str, bool]:
    """Text of an example value: tensors by dtype, sizes, strides and device; symbolic sizes with their hints."""
    if isinstance(v, torch.Tensor):
        shape, ok1 = value_text(tuple(v.shape))
        stride, ok2 = value_text(tuple(v.stride()))
        return f"T({v.dtype},{shape},{stride},{v.device.type})", ok1 and ok2
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = v.node.hint
        return f"{v}@{hint}", hint is not None
    if isinstance(v, (list, tuple)):
        parts = [value_text(x) for x in v]
        return "(" + ",".join(p for p, _ in parts) + ")", all(ok for _, ok in parts)
    text = repr(v)
    return text, " at 0x" not in text


def _node_signature(node: fx.Node) -> tuple[str, bool]:
    """(signature, stable): equal signatures trace to the same aten ops; a stable one holds across processes."""
    stable = True

    def fmt(a: Any) -> str:
        nonlocal stable
        if isinstance(a, fx.Node):
            text, ok = value_text(example_value(a))
            stable = stable and ok
            return "V" + text
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(fmt(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}:{fmt(v)}" for k, v in sorted(a.items())) + "}"
        text, ok = value_text(a)
        stable = stable and ok
        return text

    target, pinned = _target_text(node)
    sig = f"{node.op}|{target}|{fmt(node.args)}|{fmt(node.kwargs)}"
    return sig, stable and pinned


def _make_region(index: int, kind: str, nodes: list[fx.Node], ops_of: dict[fx.Node, list[str]],
                 sigs: dict[fx.Node, tuple[str, bool]]) -> Region | None:
    members = set(nodes)
    inputs: list[fx.Node] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members and a not in inputs:
                inputs.append(a)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    if not outputs:
        return None
    if any(not isinstance(example_value(o), torch.Tensor) for o in outputs):
        return None
    for a in inputs:
        v = example_value(a)
        if not isinstance(v, (torch.Tensor, torch.SymInt, int, float, bool)):
            return None
    ops = [o for n in nodes for o in ops_of.get(n, []) if o not in _VIEW_OPS]
    if kind == "reduction":
        opset = set(ops)
        if opset & {"_softmax", "_log_softmax"} or {"amax", "exp", "sum"} <= opset:
            kind = KIND_SOFTMAX
        elif opset & _NORM_MARKERS:
            kind = KIND_NORM
        else:
            kind = KIND_REDUCTION
    vals = [example_value(a) for a in inputs] + [example_value(o) for o in outputs]
    symbolic = any(_is_symbolic(v) for v in vals)
    devices = {v.device.type for v in vals if isinstance(v, torch.Tensor)}
    if len(devices) > 1:
        return None
    node_sigs = [sigs.get(n) or _node_signature(n) for n in nodes]
    sig = hashlib.sha256("\n".join(
        [ns + "|" + ",".join(str(nodes.index(a)) if a in members else f"in{inputs.index(a)}"
                             for a in n.all_input_nodes) for n, (ns, _) in zip(nodes, node_sigs)]
        + ["out:" + ",".join(str(nodes.index(o)) for o in outputs)]
    ).encode()).hexdigest()[:24]
    return Region(index=index, kind=kind, nodes=nodes, inputs=inputs, outputs=outputs, ops=ops,
                  symbolic=symbolic, device=devices.pop() if devices else "cpu", signature=sig,
                  stable=all(ok for _, ok in node_sigs))


# ----------------------------------------------------------------------------------------- region callables


def region_module(gm: fx.GraphModule, region: Region) -> fx.GraphModule:
    """A GraphModule computing the region: ``forward(*region.inputs) -> tuple(region.outputs)``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, a in enumerate(region.inputs):
        ph = graph.placeholder(f"in{i}")
        ph.meta = dict(a.meta)
        env[a] = ph
    for n in region.nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[o] for o in region.outputs))
    module = fx.GraphModule(gm, graph, class_name="KsRegion")
    return module


def concrete_inputs(region: Region) -> list[Any]:
    """Example inputs at the symbols' hints (fake tensors; no real memory)."""
    conc = _Concretizer()
    return [conc(example_value(a)) for a in region.inputs]


# memo key -> (Problem, objects the key names by address). Holding those objects keeps their addresses from
# being reused by other objects while the entry lives.
_PROBLEM_MEMO: dict[str, tuple[Any, tuple[Any, ...]]] = {}


def region_problem(gm: fx.GraphModule, region: Region) -> Any:
    """The region as a Problem (KernelBench source, canonical key), memoized by structure: per process, and on
    disk across processes for regions of a graph whose analysis may be kept (see :class:`ks_inductor.compiler.analysis_memo.AnalysisMemo`)."""
    from ks_core.problem_record import Problem
    from ks_inductor.problem_tracing import problem_from_callable

    memo_key = region.signature + "|" + ",".join(_conc_sig(v) for v in concrete_inputs(region))
    hit = _PROBLEM_MEMO.get(memo_key)
    problem = hit[0] if hit is not None else None
    if problem is None and region.memo is not None:
        data = region.memo.problem(memo_key)
        if data is not None:
            try:
                problem = Problem.from_json(data)
            except Exception as e:  # noqa: BLE001 - a damaged entry is recomputed
                log.debug("analysis memo: unusable problem entry (%s); tracing the region", e)
    if problem is None:
        module = region_module(gm, region)
        name = f"{region.kind}_{'_'.join(dict.fromkeys(region.ops))[:60]}"
        problem = problem_from_callable(module, concrete_inputs(region), name=name)
        COUNTERS["region_traces"] += 1
        region.traced = True
    if hit is None:
        pins = () if region.stable else tuple(_pinned_objects(gm, region))
        _PROBLEM_MEMO[memo_key] = (problem, pins)
    if region.memo is not None:
        region.memo.put_problem(memo_key, problem)
    region.problem = problem
    return problem


def _pinned_objects(gm: fx.GraphModule, region: Region) -> list[Any]:
    out: list[Any] = []
    for n in region.nodes:
        out.append(n.target)
        if n.op == "call_module":
            with contextlib.suppress(AttributeError):
                out.append(gm.get_submodule(str(n.target)))
    return out


_NODE_MEMO: dict[str, tuple[list[str], str, str | None]] = {}  # stable node signature -> (ops, class, anchor kind)


def _conc_sig(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{v.dtype}{tuple(v.shape)}{tuple(v.stride())}"
    return repr(v)
