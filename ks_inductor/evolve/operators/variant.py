"""variant: any other variant or template of the problem that no named operator moves to (a rotary embedding's
fused or separate kernels, the order of a whole-tensor reduction's blocks, a family template from Inductor's code),
with the parameters they share carried over."""

from __future__ import annotations

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.operators.base import Operator, available
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import OPERATORS, register
from ks_inductor.seeds.families import FamilyMatch, Template


class SwitchVariant(Operator):
    name = "variant"
    what = "render the parent's parameters with another variant or template that no named operator moves to"

    def targets(self, parent: Candidate, fm: FamilyMatch,
                templates: list[Template] | None = None) -> list[tuple[Template, str]]:
        if not parent.template:
            return []
        named = {(t.name, v) for op in OPERATORS.values() if op is not self
                 for t, v in op.targets(parent, fm, templates)}
        return [(t, v) for t in available(fm, templates).values() for v in t.variants(fm)
                if (t.name, v) != (parent.template, parent.variant) and (t.name, v) not in named]

    def score(self, fb: Feedback) -> float:
        return 0.1


register(SwitchVariant())
