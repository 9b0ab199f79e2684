"""The one registry of op families, and classification against it.

Every family module calls ``register(Family(...))`` once, when ``ks_inductor.seeds.families`` imports it. A problem
belongs to the first family, in ascending ``priority``, whose matcher accepts its aten graph; the priorities are the
only statement of that order. Classification reads the graph (``Problem.graph_text``), never the problem's name or
source text: RMSNorm written by hand is pow/mean/add/rsqrt/mul whatever it is called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ks_core.problem_record import Problem
from ks_inductor.seeds.families.match import FamilyMatch, model_state
from ks_inductor.seeds.families.template import Template
from ks_inductor.seeds.graph import Graph, parse_graph

log = logging.getLogger(__name__)

Matcher = Callable[[Graph], dict[str, Any] | None]


@dataclass(frozen=True)
class Family:
    """An op family: which problems it covers and the templates that write their kernels.

    ``match`` reads a problem's aten graph and returns what the templates need (``FamilyMatch.attrs``), or None.
    ``kind`` names the match where the family distinguishes several ops (the row-wise family tells RMSNorm from
    softmax); its names are ``kinds``, and a template's ``families`` lists the kinds it writes. A ``generic``
    family is no family of its own: it matches what no other family does, and its templates seed every problem,
    ahead of the family's own."""

    name: str
    priority: int
    match: Matcher
    templates: tuple[Template, ...] = ()
    kinds: tuple[str, ...] = ()
    kind: Callable[[Graph, dict[str, Any]], str] | None = None
    generic: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """The names this family's matches carry."""
        return self.kinds or (self.name,)

    def kind_of(self, graph: Graph, attrs: dict[str, Any]) -> str:
        return self.kind(graph, attrs) if self.kind is not None else self.name


# name -> Family, in the order classification tries them.
FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to the registry. A clash with a registered family (name, priority, a kind, a template's name)
    is an error: two families at one priority would leave the order to import order."""
    for other in FAMILIES.values():
        if other.name == family.name:
            raise ValueError(f"family {family.name!r} is registered twice")
        if other.priority == family.priority:
            raise ValueError(f"families {other.name!r} and {family.name!r} share priority {family.priority}")
        if set(other.names) & set(family.names):
            raise ValueError(f"families {other.name!r} and {family.name!r} both name {set(other.names) & set(family.names)}")
        if {t.name for t in other.templates} & {t.name for t in family.templates}:
            raise ValueError(f"families {other.name!r} and {family.name!r} share a template name")
    for t in family.templates:
        if not set(t.families) <= set(family.names):
            raise ValueError(f"template {t.name!r} covers {t.families}, family {family.name!r} names {family.names}")
    ordered = sorted([*FAMILIES.values(), family], key=lambda f: f.priority)
    FAMILIES.clear()
    FAMILIES.update((f.name, f) for f in ordered)
    return family


def matching(graph: Graph) -> list[tuple[Family, str, dict[str, Any]]]:
    """Every family (not the generic one) whose matcher accepts ``graph``, in the order classification tries them,
    with the match's name and attrs; the first is the problem's family."""
    out = []
    for fam in FAMILIES.values():
        if not fam.generic and graph.nodes and (attrs := fam.match(graph)) is not None:
            out.append((fam, fam.kind_of(graph, attrs), attrs))
    return out


def classify(problem: Problem) -> FamilyMatch | None:
    """Classify a problem, or None where no template covers it (then Inductor's kernels or the LLM seed it)."""
    graph = parse_graph(problem.graph_text)
    if not graph.nodes:
        return None
    for fam in FAMILIES.values():
        if not fam.generic and (attrs := fam.match(graph)) is not None:
            return _with_state(fam.kind_of(graph, attrs), problem, graph, attrs)
    return None


def _generic() -> Family:
    return next(f for f in FAMILIES.values() if f.generic)


def generic_match(problem: Problem) -> FamilyMatch | None:
    """A match with no op-family template: the graph, Model's state and constructor, so that Inductor's kernels
    can be rendered as a candidate. None where the graph is empty or Model cannot be built."""
    graph = parse_graph(problem.graph_text)
    fam = _generic()
    attrs = fam.match(graph) if graph.nodes else None
    return None if attrs is None else _with_state(fam.name, problem, graph, attrs)


def family_of(problem: Problem) -> str | None:
    """The op family a template covers for this problem, or None."""
    m = classify(problem)
    return m.family if m else None


def _with_state(family: str, problem: Problem, graph: Graph, attrs: dict[str, Any]) -> FamilyMatch | None:
    """The match, with Model's parameters and constructor read; None where Model cannot be built (user code: no
    seed then, not a crash) or holds more tensors than the graph takes."""
    try:
        state, sig = model_state(problem)
    except Exception as e:  # noqa: BLE001
        log.warning("could not read the parameters of %s: %s", problem.name, e)
        return None
    if len(state) > len(graph.placeholders):
        return None
    return FamilyMatch(family, problem, graph, state, sig, attrs)


def templates_for(fm: FamilyMatch) -> list[Template]:
    """The op-family templates that cover ``fm`` (not the generic family's)."""
    return [t for fam in FAMILIES.values() if not fam.generic and fm.family in fam.names
            for t in fam.templates if t.applicable(fm)]


def seed_templates(fm: FamilyMatch, inductor: bool = True) -> list[Template]:
    """What a search seeds from: the generic family's templates (Inductor's kernels, where Inductor makes any:
    every region starts from the kernel a plain compile would run) unless ``inductor`` is off, then the family's."""
    generic = [t for t in _generic().templates if t.applicable(fm)] if inductor else []
    return generic + templates_for(fm)


def template_named(name: str) -> Template:
    for fam in FAMILIES.values():
        for t in fam.templates:
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
