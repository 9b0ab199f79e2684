"""merge_splits: a split reduction (split-K, split-KV) done by one program per output again, where the outputs
alone give every SM work and the partials' round trip through memory is pure cost."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class MergeSplits(Operator):
    name = "merge_splits"
    what = ("let one program reduce a whole output (all of K, the whole key/value sequence) and write it directly, "
            "dropping the partials' workspace and the combining kernel")
    moves = (("attention", "split", "attention", "direct"), ("matmul", "splitk", "matmul", "tiled"))

    def score(self, fb: Feedback) -> float:
        if fb.programs >= 2 * fb.sm_count:
            return 0.8
        return 0.3 if fb.programs >= fb.sm_count else 0.05


register(MergeSplits())
