"""split_k: a GEMM with few output tiles cuts its K loop into slices that separate programs reduce, an epilogue
kernel adding the slices' fp32 partials."""

from __future__ import annotations

import random
from typing import Any

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import Feedback, facts
from ks_inductor.evolve.operators.registry import register
from ks_inductor.seeds.families import FamilyMatch, Template

# K from which a product counts as deep enough to split (several K tiles per slice at the usual BLOCK_K).
DEEP_K = 1024


class SplitK(Operator):
    name = "split_k"
    what = ("cut the K loop of a GEMM with few output tiles into slices reduced by separate programs, then add the "
            "slices' partials in an epilogue kernel")
    moves = (("matmul", "tiled", "matmul", "splitk"), ("matmul", "persistent", "matmul", "splitk"),
             ("matmul", "tma", "matmul", "splitk"), ("inductor", ANY, "matmul", "splitk"))

    def tune(self, t: Template, fm: FamilyMatch, variant: str, params: dict[str, Any], fb: Feedback | None,
             rng: random.Random) -> dict[str, Any]:
        # Enough slices for two programs per SM, no more than there are K tiles.
        f = facts(fm, fb)
        tiles = -(-f.rows // int(params["BLOCK_M"])) * -(-f.cols // int(params["BLOCK_N"]))
        k_tiles = -(-f.row_len // int(params["BLOCK_K"]))
        want = -(-2 * f.sm_count // max(1, tiles))
        choices = [s for s in t.space(fm, variant)["SPLIT_K"] if s <= max(2, k_tiles)]
        if choices:
            params = {**params, "SPLIT_K": min(choices, key=lambda s: (abs(s - want), -s))}
        return params

    def score(self, fb: Feedback) -> float:
        if fb.programs < fb.sm_count:
            return 1.0 if fb.row_len >= DEEP_K else 0.6
        return 0.3 if fb.programs < 2 * fb.sm_count else 0.05


register(SplitK())
