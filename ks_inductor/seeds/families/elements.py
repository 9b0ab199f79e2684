"""Reading a pointwise chain's inputs element by element over one index space (an output's shape): inputs that
have that shape and a contiguous layout at the flat offset, broadcast or viewed ones (a bias, a slice of a fused
gate/up tensor, a per-row target) through their expanded strides, up to 4-D. The pointwise template and the
whole-tensor reductions read their inputs this way."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ks_inductor.seeds.families.match import FamilyMatch
from ks_inductor.seeds.families.matchers import leaf_of
from ks_inductor.seeds.families.template import TemplateError, view_expr
from ks_inductor.seeds.graph import Node, Ref
from ks_inductor.seeds.pointwise import Val

BROADCAST_HELPER = '''
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

_INTS = ("int64", "int32", "int16", "int8", "uint8")


def _contiguous(shape: list[int], stride: list[int] | None) -> bool:
    if stride is None:
        return False
    expect, acc = [], 1
    for d in reversed(shape):
        expect.append(acc)
        acc *= d
    return list(reversed(expect)) == list(stride) or any(d == 0 for d in shape)


def chain_leaves(fm: FamilyMatch, nodes: Iterable[Node], inside: set[str],
                 outside: frozenset[str] = frozenset()) -> dict[str, tuple[str, list]]:
    """Every value ``nodes`` read that is not computed by the chain (``inside``) nor handed to the kernel another
    way (``outside``): graph name -> (placeholder, view nodes)."""
    g = fm.graph
    leaves: dict[str, tuple[str, list]] = {}
    for n in nodes:
        for r in n.refs():
            if r in inside or r in outside:
                continue
            leaf = leaf_of(g, Ref(r))
            if leaf is None:
                raise TemplateError(f"value {r} is neither computed pointwise nor a (viewed) input")
            leaves[r] = leaf
    return leaves


@dataclass
class ElementReads:
    """How a kernel reads each leaf over the index space: kernel argument ``in{i}_ptr`` and value ``v{i}`` for the
    i-th name, at the flat offset ``offs`` or through 4-D strides."""

    fm: FamilyMatch
    names: list[str]
    leaves: dict[str, tuple[str, list]]
    flat: dict[str, bool]
    env: dict[str, Val]

    @property
    def strided(self) -> list[str]:
        return [r for r in self.names if not self.flat[r]]

    def kernel_params(self) -> list[str]:
        return [f"in{i}_ptr" for i in range(len(self.names))]

    def stride_params(self) -> list[str]:
        if not self.strided:
            return []
        return ["D1", "D2", "D3"] + [f"s{self.names.index(r)}_{k}" for r in self.strided for k in range(4)]

    def index_lines(self, ind: str) -> list[str]:
        if not self.strided:
            return []
        return [ind + ln for ln in ("i3 = offs % D3", "r = offs // D3", "i2 = r % D2", "r = r // D2", "i1 = r % D1",
                                    "i0 = r // D1")]

    def load_lines(self, ind: str, evict: bool = False) -> list[str]:
        out = []
        for i, r in enumerate(self.names):
            addr = "offs" if self.flat[r] else f"i0 * s{i}_0 + i1 * s{i}_1 + i2 * s{i}_2 + i3 * s{i}_3"
            conv = ".to(tl.float32)" if self.env[r].kind == "f" else ""
            hint = ', eviction_policy="evict_first"' if evict and self.flat[r] else ""
            out.append(ind + f"v{i} = tl.load(in{i}_ptr + {addr}, mask=mask, other=0{hint}){conv}")
        return out

    def forward_lines(self) -> list[str]:
        """``t{i}`` for each leaf, and ``shape``, the broadcast of their shapes."""
        f = []
        for i, r in enumerate(self.names):
            f.append(f"t{i} = {view_expr(self.fm, self.fm.graph, self.leaves[r])}"
                     + (".contiguous()" if self.flat[r] else ""))
        if self.names:
            f.append("shape = _broadcast_shape(" + ", ".join(f"t{i}.shape" for i in range(len(self.names))) + ")")
        return f

    def call_args(self) -> list[str]:
        return [f"t{i}" for i in range(len(self.names))]

    def stride_forward_lines(self) -> list[str]:
        if not self.strided:
            return []
        f = ["dims = [1] * (4 - len(shape)) + list(shape)"]
        f += [f"st{self.names.index(r)} = _strides4(t{self.names.index(r)}, shape)" for r in self.strided]
        return f

    def stride_call_args(self) -> list[str]:
        if not self.strided:
            return []
        return ["dims[1]", "dims[2]", "dims[3]"] + [f"st{self.names.index(r)}[{k}]" for r in self.strided
                                                    for k in range(4)]


def element_reads(fm: FamilyMatch, leaves: dict[str, tuple[str, list]], shape: list[int]) -> ElementReads:
    """The reads of ``leaves`` over an index space of ``shape``."""
    g = fm.graph
    flat: dict[str, bool] = {}
    spec_strides = {f"p{len(fm.state) + i}": s.stride for i, s in enumerate(fm.problem.input_specs)}
    for r, (p, views) in leaves.items():
        t = g.type_of(p)
        stride = spec_strides.get(p) if not fm.is_state(p) else None
        if fm.is_state(p) and t is not None:
            stride = None
            if not views:
                acc, st = 1, []
                for d in reversed(t.shape):
                    st.append(acc)
                    acc *= d
                stride = list(reversed(st))
        flat[r] = not views and t is not None and t.shape == shape and _contiguous(t.shape, stride)
    if len(shape) > 4 and not all(flat.values()):
        raise TemplateError("broadcast or viewed reads over more than 4 dims are not supported")
    names = list(leaves)
    env: dict[str, Val] = {}
    for i, r in enumerate(names):
        t = g.type_of(leaves[r][0])
        kind = "i" if t is not None and t.dtype in _INTS else "b" if t is not None and t.dtype == "bool" else "f"
        env[r] = Val(f"v{i}", kind)
    return ElementReads(fm, names, leaves, flat, env)
