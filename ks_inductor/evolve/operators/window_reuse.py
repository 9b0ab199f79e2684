"""window_reuse: a pool that computes each output from its own window loads gives each program a strip of output
rows instead, loading every input row of the strip once for all the windows that overlap on it."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


class WindowReuse(Operator):
    name = "window_reuse"
    what = ("give each program a strip of output rows and load each input row of the strip once for every window "
            "that covers it, instead of one window's loads per output")
    moves = (("pool", "flat", "pool", "window"), ("inductor", ANY, "pool", "window"))

    def score(self, fb: Feedback) -> float:
        a = fb.attrs
        try:
            h = a["nd"] - 2
            overlap = (a["kernel"][h] - 1) * a["dilation"][h] + 1 > a["stride"][h]
        except (KeyError, IndexError, TypeError):
            return 0.2
        return 1.0 if overlap else 0.2


register(WindowReuse())
