"""The embedded mutator: no model, no endpoint. A step either applies a structural operator
(``ks_inductor.evolve.operators``: split a reduction, one pass instead of a chunked sweep, a persistent grid, more
rows per program, split-K, split-KV, ...), drawn among those that apply to the parent by how strongly the judge's
feedback calls for each, or moves one tunable parameter a template declares (block sizes, warps, stages, GROUP_M,
rows per program, waves of a persistent grid, ...) to a neighbouring or random value. The further the parent is
from its roofline floor, the likelier a structural step; while an operator that applies has not been tried on the
problem, most steps are structural. For programs no template rendered it nudges their integer
launch parameters instead."""

from __future__ import annotations

import logging
import random
import re
from typing import Any

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.archive import Program
from ks_inductor.evolve.mutators.base import Mutation, describe_source, unified_diff
from ks_inductor.evolve.operators import Feedback, applicable, feedback_for, pick, seeded_variants
from ks_inductor.seeds.families import FamilyMatch, Template, TemplateError, seed_templates, template_named

log = logging.getLogger(__name__)

_FEASIBLE_TRIES = 20
# Operators tried for one step before it falls back to a parameter move (one that does not render, or renders a
# program already judged, gives way to the next).
_OPERATOR_TRIES = 3
# The least chance of a structural step while an operator that applies to the parent has not been tried on the
# problem.
UNTRIED_CHANCE = 0.75
_TWEAKABLE = re.compile(r"\b(num_warps|num_stages|BLOCK\w*|GROUP_M|ROWS|WAVES)\s*=\s*(\d+)")


class EmbeddedMutator:
    kind = "embedded"

    def __init__(self, fm: FamilyMatch | None, variant_prob: float = 0.25, two_param_prob: float = 0.2,
                 inductor: bool = True) -> None:
        self.fm = fm
        self.templates: list[Template] = seed_templates(fm, inductor) if fm else []
        self.variant_prob = variant_prob
        self.two_param_prob = two_param_prob

    # ------------------------------------------------------------------ seeds
    def seeds(self, ctx: Any = None) -> list[Candidate]:
        """The seeded variants (``operators.seeded_variants``: Inductor's kernel, each template's best guess, and
        what no operator reaches) at their default parameters; then the alternate launch shapes that templates
        offer for them. Every other variant is an operator's step away."""
        out: list[Candidate] = []
        if self.fm is None:
            return out
        fm = self.fm
        pairs = seeded_variants(fm, self.templates)
        plan = ([(t, v, t.default(fm, v, fm.target)) for t, v in pairs]
                + [(t, v, p) for t, v in pairs for p in t.alternates(fm, v, fm.target)])
        for t, v, params in plan:
            try:
                src = t.render(fm, params, v)
            except TemplateError:
                continue
            out.append(Candidate(src, params=params, mutation="seed", template=t.name, variant=v))
        return out

    def descriptor(self, cand: Candidate) -> dict[str, Any]:
        if cand.template and self.fm is not None:
            try:
                t = template_named(cand.template)
                return t.descriptor(self.fm, cand.params, cand.variant or "")
            except (KeyError, TemplateError):
                pass
        return describe_source(cand.source)

    # ------------------------------------------------------------------ mutation
    def propose(self, parents: list[tuple[Program, int]], ctx: Any, rng: random.Random) -> list[Mutation]:
        return [self.mutate(p, rng, ctx) for p, _ in parents]

    def mutate(self, parent: Program, rng: random.Random, ctx: Any = None) -> Mutation:
        """One step from ``parent``. ``ctx`` (the evolver's ``MutationContext``), where given, adds the device's
        facts and the archive (what each operator gained on the problem so far, what was judged already) to the
        feedback the operators are weighed by."""
        pc = Candidate.from_json(parent.candidate)
        if pc.template and self.fm is not None:
            try:
                return self._mutate_template(pc, parent, rng, ctx)
            except (KeyError, TemplateError) as e:
                return Mutation("param", error=f"template could not render: {e}")
        return self._tweak_source(pc, parent, rng)

    def feedback(self, parent: Program, ctx: Any = None) -> Feedback:
        """What the operators are weighed by for a step from ``parent``."""
        assert self.fm is not None
        return feedback_for(self.fm, parent, getattr(ctx, "hardware", None), getattr(ctx, "archive", None))

    def structural_chance(self, fb: Feedback, untried: bool = False) -> float:
        """The chance that a step is structural: ``variant_prob`` where the parent's distance to its floor is
        unknown, up to half as much again far from it, less close to it; at least ``UNTRIED_CHANCE`` while an
        operator that applies to the parent has made no child on the problem yet (``untried``), since a structure
        never judged there says more than another parameter of one that was."""
        chance = min(1.0, self.variant_prob * (0.5 + fb.room))
        return max(chance, UNTRIED_CHANCE) if untried else chance

    def _mutate_template(self, pc: Candidate, parent: Program, rng: random.Random, ctx: Any) -> Mutation:
        # The parent as the archive knows it: its id and generation are the step's.
        pc.id, pc.generation = parent.id, parent.generation
        fb = self.feedback(parent, ctx)
        untried = getattr(ctx, "archive", None) is not None and any(
            op.name not in fb.tried for op in applicable(pc, self.fm, self.templates))
        if rng.random() < self.structural_chance(fb, untried):
            mut = self._operator_step(pc, rng, fb, ctx)
            if mut is not None:
                return mut
        return self._param_step(pc, rng)

    def _operator_step(self, pc: Candidate, rng: random.Random, fb: Feedback, ctx: Any) -> Mutation | None:
        assert self.fm is not None
        archive = getattr(ctx, "archive", None)
        tried: set[str] = set()
        for _ in range(_OPERATOR_TRIES):
            op = pick(pc, self.fm, fb, rng, self.templates, exclude=tried)
            if op is None:
                return None
            tried.add(op.name)
            try:
                child = op.apply(pc, self.fm, rng, self.templates, fb)
            except (KeyError, TemplateError) as e:
                log.debug("%s did not apply to %s/%s: %s", op.name, pc.template, pc.variant, e)
                continue
            if archive is not None and archive.is_seen(child.source_hash):
                continue
            t = template_named(child.template or "")
            return Mutation(op.name, child, diff=unified_diff(pc.source, child.source),
                            descriptor=t.descriptor(self.fm, child.params, child.variant or ""), operator=op.name)
        return None

    def _param_step(self, pc: Candidate, rng: random.Random) -> Mutation:
        assert self.fm is not None
        t = template_named(pc.template or "")
        variants = t.variants(self.fm)
        v = pc.variant if pc.variant in variants else variants[0]
        space = t.space(self.fm, v)
        keys = [k for k, vals in space.items() if len(vals) > 1]
        if not keys:
            return Mutation("param", error=f"{t.name}/{v} has no parameter with a choice")
        for _ in range(_FEASIBLE_TRIES):
            params = t.coerce(self.fm, dict(pc.params), v)
            n = 2 if rng.random() < self.two_param_prob and len(keys) > 1 else 1
            for k in rng.sample(keys, n):
                params[k] = _move(space[k], params[k], rng)
            if t.feasible(self.fm, params, v):
                break
        else:
            return Mutation("param", error="no feasible neighbour of the parent's parameters was found")
        src = t.render(self.fm, params, v)
        child = Candidate(src, params=params, parent_id=pc.id, mutation="param", template=t.name, variant=v,
                          generation=pc.generation + 1)
        return Mutation("param", child, diff=unified_diff(pc.source, src), descriptor=t.descriptor(self.fm, params, v))

    def _tweak_source(self, pc: Candidate, parent: Program, rng: random.Random) -> Mutation:
        sites = list(_TWEAKABLE.finditer(pc.source))
        if not sites:
            return Mutation("tweak", error="no tunable launch parameter found in the parent's source")
        m = rng.choice(sites)
        name, val = m.group(1), int(m.group(2))
        if name == "num_stages":
            choices = [1, 2, 3, 4, 5]
        elif name == "num_warps":
            choices = [1, 2, 4, 8, 16, 32]
        else:
            choices = sorted({max(1, val // 4), max(1, val // 2), val, val * 2, val * 4})
        new = _move(choices, val, rng)
        src = pc.source[: m.start(2)] + str(new) + pc.source[m.end(2):]
        child = Candidate(src, params={name: new}, parent_id=parent.id, mutation="tweak",
                          generation=parent.generation + 1)
        return Mutation("tweak", child, diff=unified_diff(pc.source, src), descriptor=describe_source(src))


def _move(choices: list[Any], current: Any, rng: random.Random) -> Any:
    """A neighbour of ``current`` in the ordered choices (mostly), or any other value."""
    if current not in choices:
        return rng.choice(choices)
    i = choices.index(current)
    if rng.random() < 0.75:
        steps = [j for j in (i - 1, i + 1) if 0 <= j < len(choices)]
        if steps:
            return choices[rng.choice(steps)]
    rest = [c for c in choices if c != current]
    return rng.choice(rest) if rest else current
