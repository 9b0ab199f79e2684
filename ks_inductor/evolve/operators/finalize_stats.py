"""finalize_stats: a chunked norm whose apply programs each merge all of their group's chunk statistics gets a
kernel between the passes that merges them once per group."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class FinalizeStats(Operator):
    name = "finalize_stats"
    what = ("merge each group's chunk statistics once, in a kernel between the statistics and apply passes, so that "
            "every apply program reads two numbers instead of all the chunks' statistics")
    moves = (("group_norm", "split", "group_norm", "finalize"),)

    def score(self, fb: Feedback) -> float:
        chunk = int(fb.params.get("BLOCK", 1024)) * int(fb.params.get("ITERS", 1))
        chunks = -(-fb.row_len // max(1, chunk))
        if chunks >= 16:
            return 1.0
        return 0.5 if chunks >= 4 else 0.1


register(FinalizeStats())
