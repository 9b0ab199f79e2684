"""Cache warming: find the regions a model needs and evolve a verified kernel for each before it is compiled.

    from ks_inductor.warm import problems_from_model, warm
    summary = warm(problems_from_model(model, inputs), store)

``sources`` says where the problems come from, ``run`` plans and runs the searches, ``region`` is one region's
search (what every executor runs), ``parallel`` and ``ray_cluster`` are the executors for several regions at once
(threads sharing one judge; a Ray cluster). The ``kernelsmith warm`` and ``kernelsmith explain`` commands are
:mod:`ks_inductor.cli.warm` and :mod:`ks_inductor.cli.explain`.
"""

from __future__ import annotations

from ks_inductor.warm.run import WarmItem, WarmSummary, warm
from ks_inductor.warm.sources import (
    WarmError,
    hf_model,
    kernelbench_model,
    load_factory,
    parse_overrides,
    problems_from_folder,
    problems_from_misses,
    problems_from_model,
)

__all__ = ["WarmError", "WarmItem", "WarmSummary", "hf_model", "kernelbench_model", "load_factory",
           "parse_overrides", "problems_from_folder", "problems_from_misses", "problems_from_model", "warm"]
