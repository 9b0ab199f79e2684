"""looped_reduction: a row held whole in registers is swept in chunks instead, with running statistics (online
softmax), so that a long row no longer fills a program's registers and more programs fit on an SM."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import LONG_ROW, Feedback
from ks_inductor.evolve.operators.registry import register


class LoopedReduction(Operator):
    name = "looped_reduction"
    what = ("sweep each row in chunks with a running max and sum (online softmax) instead of holding the whole row "
            "in registers or sweeping it once per statistic")
    moves = (("rowwise", ANY, "softmax_online", "online"), ("inductor", ANY, "softmax_online", "online"),
             ("cross_entropy", "onepass", "cross_entropy", "online"),
             ("cross_entropy", "onepass", "cross_entropy", "online_block"), ("inductor", "inductor", "inductor", "looped"))

    def score(self, fb: Feedback) -> float:
        if fb.row_len >= 4 * LONG_ROW:
            return 1.0
        if fb.row_len >= 2 * LONG_ROW:
            return 0.6
        return 0.3 if fb.row_len >= LONG_ROW else 0.05


register(LoopedReduction())
