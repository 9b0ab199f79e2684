"""The plan of an Inductor-generated computation: what a seed is rendered from.

Plain data (JSON both ways), produced by :mod:`ks_inductor.seeds.inductor.codegen` in a throwaway process and
rendered by :mod:`ks_inductor.seeds.inductor.render` in the search's process, which never imports Inductor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class SeedUnavailable(Exception):
    """Inductor's code for a problem cannot become a seed; the message says which statement or kernel stopped it."""


# Inductor's runtime helpers (triton_helpers.max2, welford_combine, ...) are vendored into a seed under this
# prefix, so they never shadow a Python builtin (``any``) or another kernel's name.
HELPER_PREFIX = "_ih_"

# The block sizes a kernel accepts without changing its meaning: Inductor drops a dimension's mask only when that
# dimension's size is a multiple of its largest block (torch/_inductor/runtime/hints.py TRITON_MAX_BLOCK), so
# every power of two up to it keeps the kernel correct.
MAX_BLOCK = {"XBLOCK": 4096, "YBLOCK": 1024, "ZBLOCK": 1024, "R0_BLOCK": 4096, "R1_BLOCK": 2048}
MAX_Y_GRID = 65535

# The launch grids Inductor's pointwise and reduction kernels use, by its inductor_meta["grid_type"].
GRID_TYPES = ("Grid1D", "Grid2D", "Grid3D", "Grid2DWithYZOverflow", "BatchMatmulGrid3D", "FixedGrid")


@dataclass(frozen=True)
class LaunchConfig:
    kwargs: dict[str, int]
    num_warps: int
    num_stages: int

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.kwargs.items())), self.num_warps, self.num_stages))


@dataclass
class KernelPlan:
    """One Inductor kernel: its ``@triton.jit`` source (helpers renamed), parameters in order, the parameters its
    configurations set (constexpr block sizes), those configurations, and its grid rule."""

    name: str
    source: str
    params: list[str]
    config_keys: list[str]
    configs: list[LaunchConfig]
    grid_type: str
    kind: str  # Inductor's heuristic: pointwise | reduction | persistent_reduction | template
    no_x_dim: bool = False
    persistent: bool = False
    # A template's launch grid is fixed by its block sizes (constants in its source, ``template_blocks``): the
    # wrapper passes it as this many trailing launch arguments, and each launch step carries it as "grid".
    fixed_grid: int = 0
    template_blocks: dict[str, int] = field(default_factory=dict)

    def tunable_blocks(self) -> list[str]:
        """Block sizes the search may move: every one Inductor's configs set, except a persistent reduction's
        (fixed by the row length) and the X block of a kernel with no X dimension."""
        out = []
        for k in self.config_keys:
            if k not in MAX_BLOCK:
                continue
            if k == "XBLOCK" and self.no_x_dim:
                continue
            out.append(k)
        return out


@dataclass
class InductorProgram:
    """Kernels, the helpers they call, the wrapper's input names (in ``Model``'s placeholder order: parameters,
    buffers, forward inputs), its steps in order, and its outputs.

    A step is ``{"alloc": name, "size", "stride", "dtype", "zero"?}``, ``{"code": python}`` (a view or an alias of
    a buffer) or ``{"launch": kernel index, "args": [python], "numels": {name: int}, "grid"?: [int, int, int]}``
    (``grid`` for a template kernel's fixed grid)."""

    kernels: list[KernelPlan] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InductorProgram:
        kernels = [KernelPlan(**{**k, "configs": [LaunchConfig(**c) for c in k["configs"]]}) for k in data["kernels"]]
        return cls(kernels=kernels, helpers=list(data["helpers"]), inputs=list(data["inputs"]),
                   steps=[dict(s) for s in data["steps"]], outputs=list(data["outputs"]))


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def grid(kernel: KernelPlan, blocks: dict[str, int], numels: dict[str, int],
         fixed: list[int] | None = None) -> tuple[int, int, int]:
    """The launch grid of ``kernel`` for block sizes ``blocks`` (Inductor's rules for its grid types); ``fixed``
    is a template launch's own grid."""
    if kernel.grid_type == "FixedGrid":
        if not fixed:
            raise SeedUnavailable(f"{kernel.name}: a fixed-grid launch without its grid")
        gx, gy, gz = (list(fixed) + [1, 1, 1])[:3]
        return gx, gy, gz
    x = cdiv(numels.get("xnumel", 1), blocks.get("XBLOCK", 1))
    y = cdiv(numels.get("ynumel", 1), blocks.get("YBLOCK", 1))
    z = cdiv(numels.get("znumel", 1), blocks.get("ZBLOCK", 1))
    if kernel.grid_type == "Grid1D":
        return x, 1, 1
    if kernel.grid_type == "Grid2D":
        return x, y, 1
    if kernel.grid_type == "Grid3D":
        return x, y, z
    if kernel.grid_type == "BatchMatmulGrid3D":
        return z, y, x  # the native batched matmul puts the batch (z) on the grid's first axis
    if kernel.grid_type == "Grid2DWithYZOverflow":
        # y beyond CUDA's 65535 limit folds into z; the kernel recombines them.
        div = cdiv(y, MAX_Y_GRID)
        return x, (0 if div == 0 else cdiv(y, div)), div
    raise SeedUnavailable(f"{kernel.name}: grid type {kernel.grid_type} is not supported")
