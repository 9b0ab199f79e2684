"""The operator interface: a named change to how a kernel computes, as moves between the variants the templates
offer, and the weight the judge's feedback gives it."""

from __future__ import annotations

import random
from typing import Any, ClassVar

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.seeds.families import FamilyMatch, Template, TemplateError, template_named, templates_for

ANY = "*"
# (from template, from variant, to template, to variant); ANY matches every template or variant.
Move = tuple[str, str, str, str]


def available(fm: FamilyMatch, templates: list[Template] | None) -> dict[str, Template]:
    """The templates a move may land on, by name: ``templates`` (the search's), else the family's own and, where
    Inductor makes code for the problem, Inductor's (asked only when a move lands there)."""
    if templates is not None:
        return {t.name: t for t in templates}
    return {t.name: t for t in templates_for(fm)}


def carry_over(t: Template, fm: FamilyMatch, variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """The target variant's defaults, with the parent's values of the parameters the two share."""
    out = t.default(fm, variant, fm.target)
    space = t.space(fm, variant)
    for k, v in params.items():
        if k in space and v in space[k]:
            out[k] = v
    return out


class Operator:
    """One named structural change. Subclasses set ``name``, ``what`` and ``moves`` and weigh the judge's feedback
    in ``score``; ``tune`` sets the parameters the change is about (the split of a split-K, ...)."""

    name: ClassVar[str] = ""
    what: ClassVar[str] = ""
    moves: ClassVar[tuple[Move, ...]] = ()

    def targets(self, parent: Candidate, fm: FamilyMatch,
                templates: list[Template] | None = None) -> list[tuple[Template, str]]:
        """The (template, variant) pairs this operator takes ``parent`` to on ``fm``: its moves from the parent's
        template and variant whose target the problem offers."""
        if not parent.template:
            return []
        avail = available(fm, templates)
        out: list[tuple[Template, str]] = []
        for ft, fv, tt, tv in self.moves:
            if ft not in (ANY, parent.template) or fv not in (ANY, parent.variant):
                continue
            t = avail.get(tt)
            if t is None and templates is None and tt == "inductor":
                t = _inductor(fm)
            if t is None:
                continue
            offered = t.variants(fm)
            for v in (offered if tv == ANY else [tv]):
                if v in offered and (t.name, v) != (parent.template, parent.variant) and (t, v) not in out:
                    out.append((t, v))
        return out

    def applies(self, parent: Candidate, fm: FamilyMatch, templates: list[Template] | None = None) -> bool:
        return bool(self.targets(parent, fm, templates))

    def tune(self, t: Template, fm: FamilyMatch, variant: str, params: dict[str, Any], fb: Feedback | None,
             rng: random.Random) -> dict[str, Any]:
        """The child's parameters, from the carried-over ones; by default those as they are."""
        return params

    def apply(self, parent: Candidate, fm: FamilyMatch, rng: random.Random, templates: list[Template] | None = None,
              feedback: Feedback | None = None) -> Candidate:
        """The child: ``parent`` rendered by one of this operator's targets, with the parameters the variants share
        carried over. Raises ``TemplateError`` where the operator does not apply or no feasible child renders."""
        targets = self.targets(parent, fm, templates)
        if not targets:
            raise TemplateError(f"{self.name} does not apply to {parent.template}/{parent.variant}")
        t, v = rng.choice(targets)
        params = self.tune(t, fm, v, carry_over(t, fm, v, parent.params), feedback, rng)
        if not t.feasible(fm, params, v):
            params = self.tune(t, fm, v, t.default(fm, v, fm.target), feedback, rng)
            if not t.feasible(fm, params, v):
                raise TemplateError(f"{self.name}: no feasible {t.name}/{v} child of the parent's parameters")
        src = t.render(fm, params, v)
        return Candidate(src, params=params, parent_id=parent.id, mutation=self.name, template=t.name, variant=v,
                         generation=parent.generation + 1)

    def score(self, fb: Feedback) -> float:
        """How strongly the feedback calls for this change, 0 (not at all) to about 1."""
        return 0.1

    def describe(self) -> str:
        return f"{self.name}: {self.what}"


def _inductor(fm: FamilyMatch) -> Template | None:
    t = template_named("inductor")
    return t if t.applicable(fm) else None
