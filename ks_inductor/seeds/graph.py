"""A problem's aten graph, read back from its normalized text (``Problem.graph_text``).

The text is the same one the canonical key hashes, so everything a template needs (ops, constants such as eps,
dims, dtypes and shapes of every value) is there without re-tracing user code. Placeholders come in the order
``make_fx`` saw them: the model's parameters, then its buffers, then the forward inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_LOW_PRECISION = ("bfloat16", "float16")


@dataclass(frozen=True)
class Ref:
    """A reference to another value of the graph (``p3`` or ``n7``)."""

    name: str


@dataclass
class TensorType:
    dtype: str
    shape: list[int]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def low_precision(self) -> bool:
        return self.dtype in _LOW_PRECISION


@dataclass
class Node:
    name: str
    target: str  # e.g. "aten.pow.Tensor_Scalar" or "<built-in function getitem>"
    args: list[Any]
    kwargs: dict[str, Any]
    out: list[TensorType | None]

    @property
    def op(self) -> str:
        """The overload packet name: ``pow`` for ``aten.pow.Tensor_Scalar``."""
        if self.target.startswith("aten."):
            return self.target.split(".")[1]
        if "getitem" in self.target:
            return "getitem"
        return self.target

    @property
    def overload(self) -> str:
        parts = self.target.split(".")
        return parts[2] if len(parts) > 2 else ""

    @property
    def type(self) -> TensorType | None:
        return self.out[0] if self.out else None

    def refs(self) -> list[str]:
        found: list[str] = []

        def walk(v: Any) -> None:
            if isinstance(v, Ref):
                found.append(v.name)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)

        walk(self.args)
        walk(self.kwargs)
        return found


@dataclass
class Graph:
    placeholders: list[tuple[str, TensorType | None]]
    nodes: list[Node]
    outputs: list[Any]
    inputs: list[str] = field(default_factory=list)  # the raw "in ..." lines

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def type_of(self, name: str) -> TensorType | None:
        for p, t in self.placeholders:
            if p == name:
                return t
        n = self.node(name)
        return n.type if n else None

    def compute_nodes(self) -> list[Node]:
        """Nodes that compute (views and getitem left out)."""
        return [n for n in self.nodes if n.op not in VIEW_OPS]

    def ops(self) -> list[str]:
        return [n.op for n in self.compute_nodes()]


VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "permute", "t", "transpose", "unsqueeze", "squeeze", "alias",
    "detach", "clone", "getitem", "lift_fresh_copy", "contiguous", "slice", "select",
})

_TYPE_RE = re.compile(r"([a-z0-9_]+)\[([0-9, ]*)\]")


def _parse_type(text: str) -> list[TensorType | None]:
    text = text.strip()
    if text == "-":
        return [None]
    if text.startswith("("):
        out: list[TensorType | None] = []
        for part in _split_top(text[1:-1]):
            out.extend(_parse_type(part))
        return out
    m = _TYPE_RE.fullmatch(text)
    if not m:
        return [None]
    shape = [int(s) for s in m.group(2).split(",") if s.strip()]
    return [TensorType(m.group(1), shape)]


def _split_top(text: str) -> list[str]:
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if cur and "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _parse_value(tok: str) -> Any:
    tok = tok.strip()
    if tok.startswith("["):
        return [_parse_value(t) for t in _split_top(tok[1:-1])]
    if re.fullmatch(r"[pn]\d+", tok):
        return Ref(tok)
    if tok in ("True", "False"):
        return tok == "True"
    if tok == "None":
        return None
    if tok == "dev":
        return "dev"
    if re.fullmatch(r"i-?\d+", tok):
        return int(tok[1:])
    if tok == "fnan":
        return float("nan")
    if tok in ("finf", "f-inf"):
        return float("inf") if tok == "finf" else float("-inf")
    if tok.startswith("f") and ("0x" in tok):
        return float.fromhex(tok[1:])
    if tok.startswith("str:"):
        return tok[4:].strip("'\"")
    return tok  # dtypes (float32), layouts, other named values


def _parse_kwargs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in _split_top(text):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = _parse_value(v)
    return out


_NODE_RE = re.compile(r"^(n\d+) = (.+?)(\[.*\])(\{.*\}) -> (.+)$")


def parse_graph(text: str) -> Graph:
    """Parse ``normalized_graph_text`` output."""
    placeholders: list[tuple[str, TensorType | None]] = []
    nodes: list[Node] = []
    outputs: list[Any] = []
    inputs: list[str] = []
    for line in text.splitlines():
        if line.startswith("in "):
            inputs.append(line)
        elif re.match(r"^p\d+ = placeholder", line):
            name, rest = line.split(" = placeholder", 1)
            placeholders.append((name, _parse_type(rest)[0]))
        elif line.startswith("return "):
            outputs = _parse_value(line[len("return "):])
            if not isinstance(outputs, list):
                outputs = [outputs]
        else:
            m = _NODE_RE.match(line)
            if m:
                args = _parse_value(m.group(3))
                nodes.append(Node(m.group(1), m.group(2), args, _parse_kwargs(m.group(4)[1:-1]),
                                  _parse_type(m.group(5))))
            elif re.match(r"^n\d+ = constant", line):
                name = line.split(" = ", 1)[0]
                nodes.append(Node(name, "constant", [], {}, _parse_type(line.split(" constant ", 1)[1])))
    return Graph(placeholders, nodes, outputs, inputs)
