"""rows_per_program: a program takes more rows, as one [ROWS, row] tile, so that short rows fill its lanes and the
loads every row shares (a norm's weights) are made once for all of them."""

from __future__ import annotations

import math
import random
from typing import Any

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.operators.base import Operator, available
from ks_inductor.evolve.operators.feedback import TILE_VALUES, Feedback, facts
from ks_inductor.evolve.operators.registry import register
from ks_inductor.seeds.families import FamilyMatch, Template
from ks_inductor.seeds.families.template import next_pow2

# The templates whose ROWS parameter is the rows (output rows, for a pool's window strips) one program holds.
ROW_TEMPLATES = ("rowwise", "reduction", "pool")
# From Inductor's kernel: the row templates' variant that holds several rows as one tile.
INDUCTOR_TO = {"rowwise": "block", "reduction": "row"}


class RowsPerProgram(Operator):
    name = "rows_per_program"
    what = ("give each program more rows as one [ROWS, row] tile, so that short rows fill its lanes and share its "
            "loads of what every row reads")

    def targets(self, parent: Candidate, fm: FamilyMatch,
                templates: list[Template] | None = None) -> list[tuple[Template, str]]:
        avail = available(fm, templates)
        if parent.template == "inductor":
            # Inductor's reduction gives a program one row (or XBLOCK rows of a fixed tile); the row templates' tile
            # of several rows is this change made to it.
            return [(t, v) for t, v in ((avail.get(n), INDUCTOR_TO[n]) for n in INDUCTOR_TO)
                    if t is not None and v in t.variants(fm)]
        t = avail.get(parent.template or "")
        if t is None or t.name not in ROW_TEMPLATES or parent.variant not in t.variants(fm):
            return []
        rows = t.space(fm, parent.variant).get("ROWS", [])
        current = parent.params.get("ROWS", t.default(fm, parent.variant, fm.target).get("ROWS", 1))
        return [(t, parent.variant)] if any(r > current for r in rows) else []

    def tune(self, t: Template, fm: FamilyMatch, variant: str, params: dict[str, Any], fb: Feedback | None,
             rng: random.Random) -> dict[str, Any]:
        space = t.space(fm, variant)
        larger = [r for r in space.get("ROWS", []) if r > params.get("ROWS", 1)]
        if not larger:
            return params
        f = facts(fm, fb)
        # Rows enough for the usual tile, mostly; now and then any larger count.
        target = max(1, TILE_VALUES // next_pow2(f.row_len))
        if t.name == "pool" or rng.random() < 0.25:
            rows = larger[0] if t.name == "pool" else rng.choice(larger)
        else:
            rows = min(larger, key=lambda r: abs(math.log2(r / target)))
        out = {**params, "ROWS": rows}
        # More rows per program want more threads to hold them: the fewest warps, from the parent's up, that fit.
        warps = out.get("num_warps")
        if warps is None:
            return out
        for w in [warps] + [w for w in space.get("num_warps", []) if w > warps]:
            if t.feasible(fm, {**out, "num_warps": w}, variant):
                return {**out, "num_warps": w}
        return out

    def score(self, fb: Feedback) -> float:
        tile = int(fb.params.get("ROWS", 1)) * fb.row_len
        if fb.many_short_rows:
            return 1.0
        if tile < TILE_VALUES:
            return 0.6 if fb.rows >= 2 * fb.sm_count else 0.3
        return 0.05


register(RowsPerProgram())
