"""tma_loads: a GEMM's operand tiles loaded through tensor descriptors (the tensor memory accelerator) on a
persistent grid, instead of pointer arithmetic per lane."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class TmaLoads(Operator):
    name = "tma_loads"
    what = ("load the operand tiles through tensor descriptors (one bulk copy per tile) on a persistent grid, "
            "instead of per-lane pointer loads")
    moves = (("matmul", "tiled", "matmul", "tma"), ("matmul", "persistent", "matmul", "tma"))

    def score(self, fb: Feedback) -> float:
        # Bulk copies free the warps' issue slots for the tensor cores: a compute-bound product gains most.
        if fb.bound == "compute":
            return 1.0 if fb.far_from_floor or fb.roofline_fraction is None else 0.6
        return 0.3


register(TmaLoads())
