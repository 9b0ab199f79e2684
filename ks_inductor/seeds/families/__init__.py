"""Op families: which problems a seed template covers, and the templates themselves.

Each family is one module of this package holding its matcher (which aten graphs it covers, and what it reads from
them) and its templates (variants, parameter space, defaults, rendering), ending in one ``register(Family(...))``.
Every module of the package is imported here, so a new family is a new file. The support modules:

    registry    Family, register, FAMILIES, classification and template lookup
    match       FamilyMatch: the graph, the matcher's attrs and the problem's Model, as templates receive them
    matchers    graph walks several matchers share (views back to a placeholder, the rotate-half pattern)
    template    the Template interface and the ModelNew shell every template renders into
    elements    reading a pointwise chain's inputs element by element (broadcasts, views)

``inductor`` is the generic family: Inductor's own kernels, a seed for every problem Inductor compiles to Triton.
"""

from __future__ import annotations

import importlib
import pkgutil

from ks_inductor.seeds.families.match import FamilyMatch, StateEntry, model_state
from ks_inductor.seeds.families.registry import (
    FAMILIES,
    Family,
    classify,
    configured,
    family_of,
    generic_match,
    matching,
    register,
    seed_templates,
    template_named,
    templates_for,
)
from ks_inductor.seeds.families.template import Template, TemplateError

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from ks_inductor.seeds.families.inductor import GENERIC, INDUCTOR  # noqa: E402

__all__ = ["FAMILIES", "GENERIC", "INDUCTOR", "Family", "FamilyMatch", "StateEntry", "Template", "TemplateError",
           "classify", "configured", "family_of", "generic_match", "matching", "model_state", "register",
           "seed_templates", "template_named", "templates_for"]
