"""The serving ops' templates in every variant render candidates the real judge (interpreter backend) accepts."""

from __future__ import annotations

from tests.test_evolve_families import small_problem
from tests.test_templates_judge import SERVING, _judge_all


def test_serving_op_templates_are_accepted_in_every_variant(judge) -> None:
    _judge_all(judge, [(n, small_problem(n), True) for n in SERVING])
