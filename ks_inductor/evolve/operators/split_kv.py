"""split_kv: decode attention with few (batch, key/value head) pairs cuts the sequence into slices that separate
programs walk (flash-decoding), a second kernel combining their partial softmax states."""

from __future__ import annotations

import math
import random
from typing import Any

from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback, facts
from ks_inductor.evolve.operators.registry import register
from ks_inductor.seeds.families import FamilyMatch, Template

# Keys from which a sequence is long enough to be worth slicing.
LONG_SEQUENCE = 512


class SplitKV(Operator):
    name = "split_kv"
    what = ("cut the key/value sequence into slices walked by separate programs, then combine their running max, "
            "sum and weighted values in a second kernel (flash-decoding)")
    moves = (("attention", "direct", "attention", "split"),)

    def tune(self, t: Template, fm: FamilyMatch, variant: str, params: dict[str, Any], fb: Feedback | None,
             rng: random.Random) -> dict[str, Any]:
        # Slices for two programs per SM: the slice length nearest (in ratio) to sequence / wanted slices.
        f = facts(fm, fb)
        want = max(1, -(-2 * f.sm_count // max(1, f.rows)))
        target = max(1.0, f.row_len / want)
        choices = [s for s in t.space(fm, variant)["SPLIT"] if s >= int(params["BLOCK_N"])]
        if choices:
            params = {**params, "SPLIT": min(choices, key=lambda s: (abs(math.log2(s / target)), -s))}
        return params

    def score(self, fb: Feedback) -> float:
        if fb.rows < fb.sm_count:
            return 1.0 if fb.row_len >= LONG_SEQUENCE else 0.5
        return 0.4 if fb.rows < 2 * fb.sm_count else 0.1


register(SplitKV())
