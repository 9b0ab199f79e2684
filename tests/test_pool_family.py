"""The pool family: max and average pools over 1-3 spatial dims, judged by the real judge (interpreter backend).

A file of its own so that the test runner's workers share the template judgments (they split work by file).
"""

from __future__ import annotations

from ks_inductor.problem import problem_from_source
from tests.test_evolve_families import EXTRA
from tests.test_templates_judge import _judge_all

POOLS = ["max_pool1d_dilated", "max_pool2d_ceil", "max_pool3d_bf16", "avg_pool1d_padded_bf16",
         "avg_pool2d_ceil_uncounted_pad", "avg_pool3d_divisor"]


def test_pool_templates_are_accepted(judge) -> None:
    """Dilation, padding, ceil_mode windows that overhang the input (the divisor clipped at the padded end),
    uncounted padding, a divisor override, bf16; and NaN kept by the max (the judge's third trial holds NaN)."""
    _judge_all(judge, [(n, problem_from_source(EXTRA[n][0], name=n), True) for n in POOLS])


def test_pool_blocks_cover_ragged_ends(judge) -> None:
    """BLOCK 128 over outputs that are no multiple of it: the last program's lanes past the end are masked."""
    _judge_all(judge, [(n, problem_from_source(EXTRA[n][0], name=n), True, {"BLOCK": 128, "num_warps": 1})
                       for n in ("max_pool2d_ceil", "avg_pool3d_divisor")])
