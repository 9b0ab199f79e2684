"""What several families' matchers share: following views back to a placeholder, the rotate-half pattern, and
walks up and down a graph's compute nodes."""

from __future__ import annotations

from typing import Any

from ks_inductor.seeds.graph import VIEW_OPS, Graph, Node, Ref

LEAF_VIEW_OPS = frozenset({"unsqueeze", "view", "_unsafe_view", "reshape", "expand", "permute", "slice", "squeeze",
                           "t", "transpose", "select", "alias", "detach", "clone", "lift_fresh_copy"})
FLOATS = ("float32", "bfloat16", "float16")


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


def downstream(comp: list[Node], start: str, skip: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """``start`` and the compute nodes (in ``comp``, topologically ordered) that read it, transitively."""
    after = {start}
    for n in comp:
        if n.name not in skip and set(n.refs()) & after:
            after.add(n.name)
    return after


def in_order(comp: list[Node], names: set[str]) -> list[str]:
    return [n.name for n in comp if n.name in names]


def views_are_leaves(graph: Graph, skip: set[str] | frozenset[str] = frozenset()) -> bool:
    """Every view node (but those in ``skip``) lies between a placeholder and its use."""
    return all(n.op not in VIEW_OPS or n.name in skip or (n.op in LEAF_VIEW_OPS and leaf_of(graph, Ref(n.name)))
               for n in graph.nodes)


def upstream(graph: Graph, names: list[str], stop: set[str]) -> set[str]:
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


def keeps_shape(graph: Graph, node: Node, src: str) -> bool:
    """Whether a view node leaves the shape of ``src`` as it is (an identity reshape)."""
    t = graph.type_of(src)
    return t is not None and node.type is not None and list(node.type.shape) == list(t.shape)
