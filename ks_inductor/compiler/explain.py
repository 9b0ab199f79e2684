"""``ks_inductor.explain(model, *inputs)``: which regions the backend sees, their keys, and what the cache holds.

It runs the same analysis as the backend (regions, problems, lookups, and the rule for which cached kernels
this process can run) on the graphs Dynamo captures, without compiling anything and without acting on misses,
so it is cheap and changes nothing in the cache; where there is no cache it creates none and reports every
region a miss. The same region list is what ``kernelsmith warm`` evolves kernels for.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ks_inductor.compiler.backend import (
    BackendOptions,
    CompileReport,
    RegionReport,
    analyze,
    current_fingerprint,
    shared_store,
)
from ks_inductor.compiler.served import region_why, render
from ks_inductor.contracts import CompileStore
from ks_inductor.judge.room import room_cell

if TYPE_CHECKING:
    from ks_core.fingerprint import EnvFingerprint
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)


@dataclass
class Explanation:
    graphs: list[CompileReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # one per distinct region key, first seen first
    no_cache: str | None = None  # where the cache was looked for, when nothing is there

    @property
    def regions(self) -> list[RegionReport]:
        return [r for g in self.graphs for r in g.regions]

    @property
    def hits(self) -> int:
        return sum(g.hits for g in self.graphs)

    @property
    def misses(self) -> int:
        return sum(g.misses for g in self.graphs)

    def table(self, title: str = "kernelsmith regions") -> Any:
        from rich.table import Table

        t = Table(title=title)
        for col in ("graph", "#", "kind", "key", "operations", "inputs", "status", "speedup vs Inductor", "room",
                    "why"):
            t.add_column(col, overflow="fold")
        colour = {"hit": "green", "evolved": "green", "eager": "cyan", "miss": "yellow", "slower": "yellow",
                  "unusable": "yellow"}
        for gi, g in enumerate(self.graphs):
            for r in g.regions:
                sp = "-" if r.speedup is None else f"{r.speedup:.2f}x"
                if r.status == "hit" and r.speedup is None:
                    sp = "untimed"
                t.add_row(str(gi), "-" if r.index < 0 else str(r.index), r.kind, (r.key or "-")[:16], r.ops,
                          r.signature, f"[{colour.get(r.status, 'red')}]{r.status}[/]", sp, room_cell(r.room),
                          region_why(r))
        return t

    def __str__(self) -> str:
        return render(self.table())

    def to_json(self) -> dict[str, Any]:
        graphs = [g.to_json() for g in self.graphs]
        for g, rep in zip(graphs, self.graphs):
            for row, r in zip(g["regions"], rep.regions):
                row["why"] = region_why(r)
        return {"graphs": graphs, "hits": self.hits, "misses": self.misses, "no_cache": self.no_cache}


def explain(model: Any, *inputs: Any, db: str | None = None, judge_backend: str | None = None,
            dynamic: bool | None = False, store: CompileStore | None = None, **kwargs: Any) -> Explanation:
    """Trace ``model(*inputs, **kwargs)`` with Dynamo and report its regions against the kernel cache: ``store``,
    one the caller has open, else the one ``db`` names (this process's shared store)."""
    opts, _ = BackendOptions.resolve({})
    opts.db = db or opts.db
    opts.judge_backend = judge_backend or opts.judge_backend
    result = Explanation()
    seen: set[str] = set()
    if store is None:
        result.no_cache = _missing_cache(opts.db)
        # Opened here rather than inside Dynamo's callback, so that a bad --db is reported as itself.
        store = _EmptyCache() if result.no_cache else shared_store(opts.db)

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any) -> Any:
        report, _hits, _store = analyze(gm, opts, act_on_miss=False, store=store)
        _stored_whys(report, store, current_fingerprint(opts.judge_backend))
        result.graphs.append(report)
        for problem in report.problems:
            if problem.key not in seen:
                seen.add(problem.key)
                result.problems.append(problem)
        return gm.forward

    compiled = torch.compile(model, backend=capture, dynamic=dynamic)
    with torch.no_grad():
        compiled(*inputs, **kwargs)
    return result


def _stored_whys(report: Any, store: CompileStore, fp: Any) -> None:
    """Each region's stored room where the analysis did not read it; and a missed region's note, where it has
    none: why the latest search of its key stored no kernel."""
    from ks_inductor.compiler.backend import stored_room

    for r in report.regions:
        if r.key and r.room is None:
            r.room = stored_room(store, r.key, fp)
    for r in report.regions:
        if r.status == "miss" and r.key and not r.note:
            why = store.last_why(r.key)
            if why:
                r.note = f"last search: {why}"


def _missing_cache(url: str | None) -> str | None:
    """The SQLite file ``url`` names when it does not exist (opening it would create it); None otherwise."""
    from kernel_cache.urls import parse_url

    path = parse_url(url).sqlite_file
    return str(path) if path is not None and not path.exists() else None


class _EmptyCache:
    """Stands in for a cache that does not exist: every lookup misses."""

    def lookup(self, problem_key: str, fingerprint: Any) -> None:
        return None

    def guard_decision(self, key: str) -> None:
        return None

    def room(self, problem_key: str, fingerprint_id: str) -> None:
        return None

    def last_why(self, problem_key: str) -> None:
        return None

    def record_miss(self, problem: Problem, fingerprint: EnvFingerprint) -> None:
        """Explain acts on no miss; nothing is recorded where there is no cache."""

    def put_guard_decision(self, key: str, fingerprint_id: str, result: dict[str, Any]) -> None:
        """Explain measures no graph."""

    def close(self) -> None:
        """Nothing is open."""


class _CallableModule(types.ModuleType):
    """``ks_inductor.compiler.explain`` is this module; calling it calls :func:`explain`, so both
    ``ks_inductor.explain(model, x)`` and ``from ks_inductor.compiler.explain import explain`` work."""

    def __call__(self, model: Any, *inputs: Any, **kwargs: Any) -> Explanation:
        return explain(model, *inputs, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
