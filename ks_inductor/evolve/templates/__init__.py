"""Seed templates, one per op family (never per benchmark problem)."""

from __future__ import annotations

from typing import Any

from ks_inductor.evolve.families import FamilyMatch
from ks_inductor.evolve.templates.attention import AttentionTemplate
from ks_inductor.evolve.templates.base import Template, TemplateError
from ks_inductor.evolve.templates.cross_entropy import CrossEntropyTemplate
from ks_inductor.evolve.templates.group_norm import GroupNormTemplate
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


def templates_for(fm: FamilyMatch) -> list[Template]:
    return [t for t in TEMPLATES if t.applicable(fm)]


def template_named(name: str) -> Template:
    for t in TEMPLATES:
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


__all__ = ["TEMPLATES", "Template", "TemplateError", "configured", "template_named", "templates_for"]
