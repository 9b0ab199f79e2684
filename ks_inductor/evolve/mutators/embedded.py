"""The embedded mutator: no model, no endpoint. It moves one tunable parameter a template declares (block sizes,
warps, stages, GROUP_M, rows per program, waves of a persistent grid, ...) to a neighbouring or random value, or
switches to another structural variant of the template (one-pass or chunked softmax, persistent or not).
For programs no template rendered it nudges their integer launch parameters instead."""

from __future__ import annotations

import random
import re
from typing import Any

from ks_inductor.candidate import Candidate
from ks_inductor.evolve.archive import Program
from ks_inductor.evolve.mutators.base import Mutation, describe_source, unified_diff
from ks_inductor.seeds.families import FamilyMatch, Template, TemplateError, seed_templates, template_named

_FEASIBLE_TRIES = 20
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
        """Each template's variants at their default parameters, the best-guess variant first; then the
        alternate launch shapes that templates offer."""
        out: list[Candidate] = []
        if self.fm is None:
            return out
        fm = self.fm
        pairs = [(t, v) for t in self.templates for v in t.variants(fm)]
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
        return [self.mutate(p, rng) for p, _ in parents]

    def mutate(self, parent: Program, rng: random.Random) -> Mutation:
        pc = Candidate.from_json(parent.candidate)
        if pc.template and self.fm is not None:
            try:
                return self._mutate_template(pc, parent, rng)
            except (KeyError, TemplateError) as e:
                return Mutation("param", error=f"template could not render: {e}")
        return self._tweak_source(pc, parent, rng)

    def _mutate_template(self, pc: Candidate, parent: Program, rng: random.Random) -> Mutation:
        assert self.fm is not None
        t = template_named(pc.template or "")
        variants = t.variants(self.fm)
        others = [(tt, v) for tt in self.templates for v in tt.variants(self.fm)
                  if (tt.name, v) != (t.name, pc.variant)]
        for _ in range(_FEASIBLE_TRIES):
            if others and rng.random() < self.variant_prob:
                tt, v = rng.choice(others)
                params = tt.default(self.fm, v, self.fm.target)
                space = tt.space(self.fm, v)
                for k, val in pc.params.items():  # carry over what the variant shares
                    if k in space and val in space[k]:
                        params[k] = val
                kind = "variant"
            else:
                tt, v = t, pc.variant if pc.variant in variants else variants[0]
                space = tt.space(self.fm, v)
                params = tt.coerce(self.fm, dict(pc.params), v)
                keys = [k for k, vals in space.items() if len(vals) > 1]
                n = 2 if rng.random() < self.two_param_prob and len(keys) > 1 else 1
                for k in rng.sample(keys, n):
                    params[k] = _move(space[k], params[k], rng)
                kind = "param"
            if tt.feasible(self.fm, params, v):
                break
        else:
            return Mutation(kind, error="no feasible neighbour of the parent's parameters was found")
        src = tt.render(self.fm, params, v)
        child = Candidate(src, params=params, parent_id=parent.id, mutation=kind, template=tt.name, variant=v,
                          generation=parent.generation + 1)
        return Mutation(kind, child, diff=unified_diff(pc.source, src),
                        descriptor=tt.descriptor(self.fm, params, v))

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
