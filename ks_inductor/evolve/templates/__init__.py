"""Seed templates, one per op family (never per benchmark problem), and Inductor's own kernels for every
family (``INDUCTOR``, kept apart from ``TEMPLATES`` because it asks Inductor for code, in a process of its own)."""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.templates.attention import AttentionTemplate
from ks_inductor.evolve.templates.base import Template, TemplateError
from ks_inductor.evolve.templates.cross_entropy import CrossEntropyTemplate
from ks_inductor.evolve.templates.group_norm import GroupNormTemplate
from ks_inductor.evolve.templates.inductor import InductorTemplate
from ks_inductor.evolve.templates.matmul import MatmulTemplate
from ks_inductor.evolve.templates.pointwise import PointwiseTemplate
from ks_inductor.evolve.templates.pool import PoolTemplate
from ks_inductor.evolve.templates.reduction import ReductionTemplate
from ks_inductor.evolve.templates.rope import RopeTemplate
from ks_inductor.evolve.templates.rowwise import RowwiseTemplate
from ks_inductor.evolve.templates.scan import ScanTemplate
from ks_inductor.evolve.templates.softmax import SoftmaxLoopTemplate
from ks_inductor.evolve.templates.total import TotalTemplate

TEMPLATES: tuple[Template, ...] = (
    RowwiseTemplate(), SoftmaxLoopTemplate(), CrossEntropyTemplate(), MatmulTemplate(), PointwiseTemplate(),
    RopeTemplate(), ReductionTemplate(), AttentionTemplate(), TotalTemplate(),
    ScanTemplate(), PoolTemplate(), GroupNormTemplate(),
)


INDUCTOR = InductorTemplate()


def templates_for(fm: FamilyMatch) -> list[Template]:
    """The op-family templates that cover ``fm``."""
    return [t for t in TEMPLATES if t.applicable(fm)]


def seed_templates(fm: FamilyMatch, inductor: bool = True) -> list[Template]:
    """What a search seeds from: Inductor's kernels where Inductor makes any (every region starts from the kernel a
    plain compile would run), then the family's templates."""
    out = templates_for(fm)
    if inductor and INDUCTOR.applicable(fm):
        out.insert(0, INDUCTOR)
    return out


def template_named(name: str) -> Template:
    for t in (*TEMPLATES, INDUCTOR):
        if t.name == name:
            return t
    raise KeyError(f"no template named {name!r}")


def configured(fm: FamilyMatch, spec: str, params: dict[str, Any] | None = None) -> tuple[Template, str, dict[str, Any]]:
    """A configuration named ``template/variant``: the template, the variant, and ``params`` over that variant's
    defaults for ``fm``'s target."""
    tname, _, variant = spec.partition("/")
    t = template_named(tname)
    if variant not in t.variants(fm):
        raise KeyError(f"{spec!r}: {tname} offers {', '.join(t.variants(fm))} here")
    return t, variant, {**t.default(fm, variant, fm.target), **(params or {})}


__all__ = ["INDUCTOR", "TEMPLATES", "Template", "TemplateError", "configured", "seed_templates", "template_named",
           "templates_for"]
