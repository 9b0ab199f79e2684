"""one_pass: a reduction that sweeps its row in chunks (an online max and sum, then a write sweep) holds the row in
registers instead and reads it once."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import LONG_ROW, Feedback
from ks_inductor.evolve.operators.registry import register


class OnePass(Operator):
    name = "one_pass"
    what = ("hold the whole row in registers and read it from memory once, instead of sweeping it in chunks with "
            "running statistics (and reading it again to write)")
    moves = (("softmax_online", "online", "rowwise", "block"), ("cross_entropy", "online", "cross_entropy", "onepass"),
             ("cross_entropy", "online_block", "cross_entropy", "onepass"), ("inductor", "looped", "inductor", "inductor"))

    def score(self, fb: Feedback) -> float:
        # The chunked sweep reads a row twice; a row that fits a program's registers need not.
        if fb.row_len <= LONG_ROW:
            s = 1.0
        elif fb.row_len <= 4 * LONG_ROW:
            s = 0.5
        else:
            s = 0.1
        return s if fb.memory_bound else s / 2


register(OnePass())
