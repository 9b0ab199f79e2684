"""persistent: a grid of one program per row block or tile becomes a few programs per SM that loop over them,
loading what every block shares (a norm's weights) once and leaving no tail wave."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class Persistent(Operator):
    name = "persistent"
    what = ("launch a few programs per SM that loop over the row blocks or tiles, instead of one program per block")
    moves = (("rowwise", "block", "rowwise", "persistent"), ("pointwise", "flat", "pointwise", "persistent"),
             ("matmul", "tiled", "matmul", "persistent"), ("inductor", ANY, "rowwise", "persistent"),
             ("inductor", ANY, "pointwise", "persistent"))

    def score(self, fb: Feedback) -> float:
        # Many waves of short programs pay a launch and a prologue each, and the last wave runs part empty.
        if fb.waves >= 8:
            return 1.0 if fb.memory_bound and fb.far_from_floor else 0.8
        return 0.4 if fb.waves >= 2 else 0.1


register(Persistent())
