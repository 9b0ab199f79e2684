"""A problem matched to a family: the graph, what the matcher extracted (``attrs``), and the problem's Model
(parameters, buffers, constructor), which is everything a template renders from."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from ks_core.problem_record import Problem
from ks_inductor.candidate import parse_source
from ks_inductor.seeds.graph import Graph, Node, Ref, TensorType


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

    from ks_core.problem_record import exec_problem_source

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
