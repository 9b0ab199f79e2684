"""What every seed template shares: the interface, and the ModelNew shell around its kernels."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from ks_inductor.seeds.families.match import FamilyMatch, StateEntry
from ks_inductor.seeds.graph import Graph, Node, Ref
from ks_inductor.seeds.pointwise import PointwiseUnsupported, Val, lower_chain, unfenced

_TORCH_DTYPES = {"bfloat16", "float16", "float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}


class TemplateError(Exception):
    """A template cannot render this problem with these parameters."""


class Template(ABC):
    """A seed template for one op family: a parameter space, structural variants, and a renderer that turns
    (params, variant) into a complete KernelBench candidate module."""

    name: str = ""
    families: tuple[str, ...] = ()

    def applicable(self, fm: FamilyMatch) -> bool:
        return fm.family in self.families

    @abstractmethod
    def variants(self, fm: FamilyMatch) -> list[str]: ...

    @abstractmethod
    def space(self, fm: FamilyMatch, variant: str) -> dict[str, list[Any]]:
        """Tunable parameters and their allowed values, in order (neighbours are adjacent)."""

    @abstractmethod
    def default(self, fm: FamilyMatch, variant: str, device: str) -> dict[str, Any]: ...

    @abstractmethod
    def render(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> str: ...

    def alternates(self, fm: FamilyMatch, variant: str, device: str) -> list[dict[str, Any]]:
        """Further seeds of a variant: launch shapes next to the default that one parameter move cannot reach, or
        that the search's noise keeps it from settling between. Empty unless a template knows of such shapes."""
        return []

    def feasible(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> bool:
        """False for corners of the space that cannot run well (a tile that spills every register): the mutator
        does not spend judgments, and compile minutes, on them."""
        return True

    def descriptor(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        """Kernel-strategy coordinates for the MAP-Elites grid."""
        block = max([v for k, v in params.items() if k.startswith("BLOCK") and isinstance(v, int)] or [1])
        rows = params.get("ROWS", 1)
        return {
            "block": block_class(block * rows),
            "warps": params.get("num_warps", 4),
            "stages": params.get("num_stages", 1),
            "dot": False,
            "fusion": 1.0,
            "persistent": "persistent" in variant,
            "variant": variant,
        }

    def coerce(self, fm: FamilyMatch, params: dict[str, Any], variant: str) -> dict[str, Any]:
        """Fill missing params with the variant's defaults and drop the ones it does not know."""
        space = self.space(fm, variant)
        base = self.default(fm, variant, fm.target)
        out = {k: params.get(k, base[k]) for k in space}
        for k, v in out.items():
            if v not in space[k]:
                out[k] = base[k]
        return out


MAX_ELEMS_PER_THREAD = 128
# Shared memory a program's pipelined (staged) tiles may take: H100/H200 have 227 KiB per block; the rest is left
# for the reductions' scratch. A part with less gets a compile failure from the judge, reported like any other.
SMEM_BYTES = 200 * 1024
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def elems_per_thread(tile: int, num_warps: int) -> float:
    return tile / (32 * max(1, num_warps))


def block_class(n: int) -> str:
    if n <= 256:
        return "S"
    if n <= 2048:
        return "M"
    if n <= 16384:
        return "L"
    return "XL"


def inner_size(fm: FamilyMatch, value: str, dim: int) -> int:
    """The elements of ``value`` after ``dim``: 1 when ``dim`` is contiguous (the row variants), the stride of
    ``dim`` otherwise (the column variants)."""
    t = fm.graph.type_of(value)
    inner = 1
    for s in t.shape[dim + 1:]:  # type: ignore[union-attr]
        inner *= s
    return inner


def lower_or_decline(nodes: list[Node], env: dict[str, Val], users: list[Node] | None = None) -> list[str]:
    """``pointwise.lower_chain`` over ``nodes``, with the rounding fences that ``unfenced`` allows given ``users``,
    the nodes outside the chain that read its values (a reduction or a scan adds them, so their roundings stay
    fenced). An op without a lowering makes the template decline."""
    try:
        return lower_chain(nodes, env, unfenced(list(nodes) + list(users or [])))
    except PointwiseUnsupported as e:
        raise TemplateError(str(e)) from None


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def torch_dtype(d: str) -> str:
    if d not in _TORCH_DTYPES:
        raise TemplateError(f"unsupported dtype {d}")
    return f"torch.{d}"


def _state_lines(state: list[StateEntry]) -> list[str]:
    lines: list[str] = []
    made: set[str] = set()
    for e in state:
        parts = e.name.split(".")
        for i in range(1, len(parts)):
            sub = ".".join(parts[:i])
            if sub not in made:
                made.add(sub)
                lines.append(f"self.{sub} = nn.Module()")
        owner = "self" + ("." + ".".join(parts[:-1]) if len(parts) > 1 else "")
        alloc = f"torch.empty({list(e.shape)!r}, dtype={torch_dtype(e.dtype)})"
        if e.buffer:
            lines.append(f"{owner}.register_buffer({parts[-1]!r}, {alloc})")
        else:
            lines.append(f"{owner}.{parts[-1]} = nn.Parameter({alloc})")
    return lines


def rounding_space(fm: FamilyMatch) -> dict[str, list[int]]:
    """The RND parameter (how intermediate bf16 roundings are computed, see ``pointwise.RNE_BF16_HELPER_HW``) for
    templates that round: offered where the target has hardware conversions and the problem has bf16 values."""
    if fm.target == "cpu":
        return {}
    typed = [t for _, t in fm.graph.placeholders] + [n.type for n in fm.graph.nodes]
    return {"RND": [0, 1]} if any(t is not None and t.dtype == "bfloat16" for t in typed) else {}


def rounding_default(fm: FamilyMatch) -> dict[str, int]:
    """Seeds round through the conversion instructions where that is offered: on the H200 the whole-row bf16
    softmax took 158 us with them against 173 us with the integer form
    (benchmarks/results/sweep-templates-nvidia-h200-2026-11-22.json)."""
    return {k: 1 for k in rounding_space(fm)}


def module_source(fm: FamilyMatch, doc: str, kernels: str, forward: list[str], helpers: str = "",
                  params: dict[str, Any] | None = None) -> str:
    """The candidate module: imports, kernels, helpers, and ``ModelNew`` holding Model's parameters."""
    from ks_inductor.seeds.pointwise import bf16_helpers, math_helpers

    helpers_src = "\n\n\n".join(h for h in (bf16_helpers(kernels, fm.target, bool((params or {}).get("RND", 0))),
                                           math_helpers(kernels, fm.target)) if h)
    if helpers_src:
        kernels = helpers_src + "\n\n\n" + kernels.strip()
    init = ["super().__init__()"] + _state_lines(fm.state)
    args = ", ".join(f"in{i}" for i in range(fm.n_inputs))
    sig = fm.init_signature
    body = "\n".join("        " + ln for ln in init)
    fwd = "\n".join("        " + ln if ln else "" for ln in forward)
    return (
        f'"""{doc}"""\n'
        "import torch\n"
        "import torch.nn as nn\n"
        "import triton\n"
        "import triton.language as tl\n\n\n"
        f"{kernels.strip()}\n\n\n"
        + (f"{helpers.strip()}\n\n\n" if helpers.strip() else "")
        + "class ModelNew(nn.Module):\n"
        f"    def __init__(self{', ' + sig if sig else ''}):\n"
        f"{body}\n\n"
        f"    def forward(self{', ' + args if args else ''}):\n"
        f"{fwd}\n"
    )


SM_COUNT_HELPER = '''
def _sm_count(t):
    if t.is_cuda:
        return torch.cuda.get_device_properties(t.device).multi_processor_count
    return 4
'''


def view_expr(fm: FamilyMatch, graph: Graph, leaf: tuple[str, list[Node]]) -> str:
    """Python (forward) expression replaying the view ops between a placeholder and its use."""
    expr = fm.operand(leaf[0])
    for v in leaf[1]:
        a = v.args
        if v.op == "unsqueeze":
            expr = f"{expr}.unsqueeze({a[1]})"
        elif v.op in ("view", "_unsafe_view", "reshape"):
            expr = f"{expr}.reshape({list(a[1])!r})"
        elif v.op == "expand":
            expr = f"{expr}.expand({list(a[1])!r})"
        elif v.op == "permute":
            expr = f"{expr}.permute({list(a[1])!r})"
        elif v.op == "t":
            expr = f"{expr}.t()"
        elif v.op == "transpose":
            expr = f"{expr}.transpose({a[1]}, {a[2]})"
        elif v.op == "select":
            expr = f"{expr}.select({a[1]}, {a[2]})"
        elif v.op == "squeeze":
            dims = a[1] if len(a) > 1 else None
            if isinstance(dims, list):
                for d in sorted(dims, reverse=True):
                    expr = f"{expr}.squeeze({d})"
            elif dims is None:
                expr = f"{expr}.squeeze()"
            else:
                expr = f"{expr}.squeeze({dims})"
        elif v.op == "slice":
            dim = a[1] if len(a) > 1 else 0
            start = a[2] if len(a) > 2 and a[2] is not None else 0
            end = a[3] if len(a) > 3 and a[3] is not None else 2**62
            step = a[4] if len(a) > 4 else 1
            if step != 1:
                raise TemplateError("strided slices are not supported")
            src = f"{expr}"
            expr = (f"{src}.narrow({dim}, {start}, min({end}, {src}.shape[{dim}]) - {start})" if start >= 0 and end >= 0
                    else f"{src}.narrow({dim}, {start} % {src}.shape[{dim}], "
                         f"({end} % {src}.shape[{dim}]) - ({start} % {src}.shape[{dim}]))")
        elif v.op in ("alias", "detach", "clone", "lift_fresh_copy"):
            pass
        else:
            raise TemplateError(f"view op {v.op} not supported")
    return expr


def output_refs(graph: Graph) -> list[str]:
    return [o.name for o in graph.outputs if isinstance(o, Ref)]
