"""flat_grid: a persistent grid that loops over row blocks or tiles becomes one program per block, launched at
once, where the blocks are few enough for one wave and the loop only adds its bookkeeping."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class FlatGrid(Operator):
    name = "flat_grid"
    what = "launch one program per row block or tile instead of a persistent grid that loops over them"
    moves = (("rowwise", "persistent", "rowwise", "block"), ("rowwise", "prefetch", "rowwise", "block"),
             ("pointwise", "persistent", "pointwise", "flat"), ("matmul", "persistent", "matmul", "tiled"))

    def score(self, fb: Feedback) -> float:
        if fb.waves <= 1:
            return 0.8
        return 0.4 if fb.waves <= 2 else 0.1


register(FlatGrid())
