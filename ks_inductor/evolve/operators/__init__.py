"""Structural operators: named changes to how a kernel computes, each a move between variants the templates offer
(split a reduction, one pass instead of two, a persistent grid, several rows per program, split-K, split-KV, ...),
weighed by the judge's feedback on the parent. One operator per module; every module of the package is imported
here, so a new operator is a new file ending in ``register(...)``. The support modules:

    base       Operator: name, what, moves, targets/applies/apply, tune, score
    feedback   Feedback: the parent's roofline fraction, memory or compute bound, rows against row length,
               programs against SMs, and how each operator fared on the problem
    registry   OPERATORS, register, and the choice among applicable operators by weight
"""

from __future__ import annotations

import importlib
import pkgutil

from ks_inductor.evolve.operators.base import ANY, Move, Operator, carry_over
from ks_inductor.evolve.operators.feedback import Feedback, OperatorRecord, feedback_for, history, step_gain
from ks_inductor.evolve.operators.registry import (
    OPERATORS,
    applicable,
    operator_named,
    pick,
    ranked,
    register,
    seeded_variants,
    weight,
)

_SUPPORT = {"base", "feedback", "registry"}
# The catch-all last, so that listings name the operators first.
for _name in sorted((m.name for m in pkgutil.iter_modules(__path__) if m.name not in _SUPPORT),
                    key=lambda n: (n == "variant", n)):
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["ANY", "OPERATORS", "Feedback", "Move", "Operator", "OperatorRecord", "applicable",
           "carry_over", "feedback_for", "history", "operator_named", "pick", "ranked", "register",
           "seeded_variants", "step_gain", "weight"]
