"""reverse_sweep: a chunked row sweep whose second pass walks the row backwards, so that it first reads the chunks
the first pass read last, while L2 still holds them. Where the rows in flight together outgrow L2, a forward second
pass asks first for the chunks read longest ago, which a recency-kept cache has already dropped."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import LONG_ROW, Feedback
from ks_inductor.evolve.operators.registry import register


class ReverseSweep(Operator):
    name = "reverse_sweep"
    what = ("write each row from its end back to its start, so the second sweep reads from L2 what the first sweep "
            "read last, and stream the output past the cache")
    moves = (("softmax_online", "online", "softmax_online", "online_tail"),)

    def score(self, fb: Feedback) -> float:
        # Only a row too long for registers is swept twice; the second read is what this saves.
        if fb.row_len >= 4 * LONG_ROW:
            return 1.0 if fb.memory_bound else 0.5
        return 0.4 if fb.row_len >= LONG_ROW else 0.1


register(ReverseSweep())
