"""KernelBench's summary figures: fast_p and geometric-mean speedups.

fast_p is the fraction of *all* problems whose kernel is correct and more than p times faster than the baseline
(KernelBench's definition: problems without a verified kernel, or with a wrong one, count in n and fail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

P_VALUES = (1.0, 1.05, 1.5, 2.0)


def fast_p(speedups: Sequence[float | None], p: float) -> float:
    """``speedups[i]`` is problem i's baseline/kernel time ratio, or None when it has no correct kernel."""
    if not speedups:
        return 0.0
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups)


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def summarize_speedups(speedups: Sequence[float | None], ps: Sequence[float] = P_VALUES) -> dict[str, object]:
    """fast_p for each p, the geometric mean over problems with a correct kernel, and the counts."""
    ok = [s for s in speedups if s is not None]
    return {
        "n": len(speedups),
        "correct": len(ok),
        "fast_p": {f"{p:g}": fast_p(speedups, p) for p in ps},
        "geomean_speedup": geomean(ok),
    }
