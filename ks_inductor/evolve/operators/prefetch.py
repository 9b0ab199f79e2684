"""prefetch: a row grid software-pipelined by hand: a program issues the loads of its next row block before it
reduces and stores the current one, so that one resident program keeps memory busy."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import SHORT_ROW, Feedback
from ks_inductor.evolve.operators.registry import register

# Values from which a row fills enough registers that only one or two programs fit on an SM.
WIDE_ROW = 4096


class Prefetch(Operator):
    name = "prefetch"
    what = ("walk row blocks on a persistent grid and load the next block while the current one is reduced and "
            "stored")
    moves = (("rowwise", "block", "rowwise", "prefetch"), ("rowwise", "persistent", "rowwise", "prefetch"),
             ("inductor", ANY, "rowwise", "prefetch"))

    def score(self, fb: Feedback) -> float:
        # Long rows leave few programs resident; their loads must overlap their compute within one program.
        if fb.row_len >= WIDE_ROW:
            return 1.0 if fb.memory_bound else 0.5
        return 0.4 if fb.row_len >= SHORT_ROW else 0.1


register(Prefetch())
