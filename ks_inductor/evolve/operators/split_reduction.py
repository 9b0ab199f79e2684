"""split_reduction: a long reduction cut into chunks that many programs reduce at once, their partials merged in a
second pass, where Inductor's kernel gives each row (group) one program."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import SHORT_ROW, Feedback
from ks_inductor.evolve.operators.registry import register


class SplitReduction(Operator):
    name = "split_reduction"
    what = ("cut each long row (norm group, whole tensor) into chunks reduced by many programs at once, then merge "
            "their partial statistics in a second pass")
    moves = (("inductor", ANY, "group_norm", "split"), ("inductor", ANY, "total", "strided"))

    def score(self, fb: Feedback) -> float:
        # Few long rows leave most SMs idle with one program a row; the split puts every SM on them.
        if fb.few_long_rows:
            return 1.0
        if fb.rows < 2 * fb.sm_count and fb.row_len >= 4 * SHORT_ROW:
            return 0.5
        return 0.1


register(SplitReduction())
