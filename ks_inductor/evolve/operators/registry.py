"""The operators by name, and the choice among those that apply to a parent, weighted by the judge's feedback."""

from __future__ import annotations

import random

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.operators.base import Operator
from ks_inductor.evolve.operators.feedback import Feedback, OperatorRecord
from ks_inductor.seeds.families import FamilyMatch, Template

OPERATORS: dict[str, Operator] = {}
# Every applicable operator keeps this weight whatever the feedback says, so that a misjudged shape still gets tried.
FLOOR_WEIGHT = 0.05
# An operator whose children have all been wrong this many times on the problem is tried less.
FAILED_TRIES = 3


def register(op: Operator) -> Operator:
    if not op.name or op.name in OPERATORS:
        raise ValueError(f"operator name {op.name!r} is empty or taken")
    OPERATORS[op.name] = op
    return op


def operator_named(name: str) -> Operator:
    try:
        return OPERATORS[name]
    except KeyError:
        raise KeyError(f"no operator named {name!r}") from None


def applicable(parent: Candidate, fm: FamilyMatch, templates: list[Template] | None = None) -> list[Operator]:
    """The operators that take ``parent`` to another variant or configuration ``fm`` offers."""
    return [op for op in OPERATORS.values() if op.applies(parent, fm, templates)]


def weight(op: Operator, fb: Feedback) -> float:
    """The operator's score on ``fb``, scaled by how it fared on the problem so far (its best gain, between half and
    twice; a third where every child it made was wrong), never below ``FLOOR_WEIGHT``."""
    w = max(0.0, op.score(fb))
    rec: OperatorRecord | None = fb.tried.get(op.name)
    if rec is not None and rec.tries:
        if rec.best_gain is not None:
            w *= min(2.0, max(0.5, rec.best_gain))
        elif rec.tries >= FAILED_TRIES and rec.correct == 0:
            w /= 3.0
    return FLOOR_WEIGHT + w


def ranked(parent: Candidate, fm: FamilyMatch, fb: Feedback,
           templates: list[Template] | None = None) -> list[tuple[Operator, float]]:
    """The applicable operators with their weights, the heaviest first."""
    out = [(op, weight(op, fb)) for op in applicable(parent, fm, templates)]
    return sorted(out, key=lambda x: -x[1])


def seeded_variants(fm: FamilyMatch, templates: list[Template]) -> list[tuple[Template, str]]:
    """The (template, variant) pairs a search seeds: each template's first variant (its best guess; Inductor's own
    kernel comes first) unless a named operator reaches it from an earlier seed, and any variant that no named
    operator reaches from the seeds, however many steps away. The rest are left to the operators, so that a search
    reaches them as named steps from a working kernel, each with its gain."""
    pairs = [(t, v) for t in templates for v in t.variants(fm)]
    firsts = [(t, vs[0]) for t in templates if (vs := t.variants(fm))]
    chosen: set[tuple[str, str]] = set()
    reached: set[tuple[str, str]] = set()
    for t, v in firsts + pairs:
        if (t.name, v) not in reached:
            chosen.add((t.name, v))
            reached |= _closure([(t, v)], fm, templates)
    return [(t, v) for t, v in pairs if (t.name, v) in chosen]


def _closure(start: list[tuple[Template, str]], fm: FamilyMatch, templates: list[Template]) -> set[tuple[str, str]]:
    """Every (template, variant) the named operators reach from ``start`` in any number of steps, ``start``
    included. The catch-all ``variant`` switch is no named change and reaches nothing here."""
    seen = {(t.name, v) for t, v in start}
    todo = list(start)
    while todo:
        t, v = todo.pop()
        parent = Candidate("", template=t.name, variant=v)
        for op in OPERATORS.values():
            if op.name == "variant":
                continue
            for tt, tv in op.targets(parent, fm, templates):
                if (tt.name, tv) not in seen:
                    seen.add((tt.name, tv))
                    todo.append((tt, tv))
    return seen


def pick(parent: Candidate, fm: FamilyMatch, fb: Feedback, rng: random.Random,
         templates: list[Template] | None = None, exclude: set[str] | None = None) -> Operator | None:
    """One applicable operator drawn in proportion to its weight; None where none applies."""
    choices = [(op, w) for op, w in ranked(parent, fm, fb, templates) if op.name not in (exclude or set())]
    if not choices:
        return None
    return rng.choices([op for op, _ in choices], weights=[w for _, w in choices], k=1)[0]
