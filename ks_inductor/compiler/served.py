"""``ks_inductor.served()``: what the compiles made with ``backend="kernelsmith"`` served, region by region.

Every region of a compiled graph runs the cached kernel swapped in for it (``kernel``), eager's own ops where the
judge measured them faster than Inductor's code (``eager``), or what Inductor generated for it (``inductor``); each
row says why, in one line. The rows come from the reports the backend
publishes as it compiles (``backend.compile_reports``), so they describe what the compiles did, not what a lookup
would find now. Operations no region takes are listed too: Inductor compiles them.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from typing import Any

from ks_inductor.compiler.backend import (
    EAGER,
    ERROR,
    EVOLVED,
    HIT,
    MISS,
    SLOWER,
    UNSUPPORTED,
    UNUSABLE,
    CompileReport,
    RegionReport,
    clear_reports,
    compile_reports,
)

KERNEL, INDUCTOR = "kernel", "inductor"
# Eager's ops, kept out of Inductor where the judge measured them faster than Inductor's code (and no kernel is).
EAGER_OPS = "eager"
# Longest "why" shown in a row; the full note stays in ``RegionReport.note``.
WHY_CHARS = 160


def one_line(text: str, limit: int = WHY_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def region_why(r: RegionReport) -> str:
    """Why a region ran what it ran, in one line: the kernel served, or what kept the cache's kernel out."""
    if r.status in (HIT, EVOLVED):
        sp = "untimed" if r.speedup is None else f"{r.speedup:.2f}x over Inductor"
        how = "evolved during this compile" if r.status == EVOLVED else "from the cache"
        # What runs: its judged plan, traced into Inductor's graph or run per call.
        runs = f", running {r.launch}" if r.launch else ""
        return one_line(f"kernel {r.kernel_id} {how} ({sp}){runs}")
    if r.note:
        return one_line(r.note)
    return {MISS: "no verified kernel in the cache for this region's key",
            SLOWER: "the cached kernel is not faster than Inductor here",
            UNSUPPORTED: "no region takes this operation",
            UNUSABLE: "the cached kernel cannot run in this process",
            ERROR: "the cached kernel failed to compile into the graph"}.get(r.status, r.status)


def render(table: Any, width: int = 200) -> str:
    """A rich renderable as plain text, as wide as ``width`` columns at most."""
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, no_color=True, highlight=False).print(table)
    return out.getvalue()


@dataclass
class ServedRegion:
    graph: int
    index: int  # -1 for operations no region takes
    kind: str
    ops: str
    key: str | None
    served: str  # "kernel", "eager" or "inductor"
    status: str  # the backend's region status (hit, miss, slower, ...)
    why: str
    kernel_id: int | None = None
    speedup: float | None = None


@dataclass
class Served:
    """What a set of compiles served: one row per region, plus each graph's fallback reason where the whole graph
    went to Inductor. JSON-serializable (``to_json``); ``str()`` renders ``table()``."""

    regions: list[ServedRegion] = field(default_factory=list)
    fallbacks: list[str | None] = field(default_factory=list)  # per graph: why nothing was swapped, or None

    @classmethod
    def from_reports(cls, reports: list[CompileReport]) -> Served:
        s = cls()
        for gi, rep in enumerate(reports):
            s.fallbacks.append(rep.fallback_reason)
            for r in rep.regions:
                swapped = r.status in (HIT, EVOLVED, EAGER) and rep.swapped > 0
                why = region_why(r)
                if r.status in (HIT, EVOLVED, EAGER) and not swapped:
                    why = one_line(rep.fallback_reason or "the graph was compiled without its kernels")
                what = (EAGER_OPS if r.status == EAGER else KERNEL) if swapped else INDUCTOR
                s.regions.append(ServedRegion(graph=gi, index=r.index, kind=r.kind, ops=r.ops, key=r.key,
                                              served=what, status=r.status, why=why,
                                              kernel_id=r.kernel_id, speedup=r.speedup))
        return s

    @property
    def kernels(self) -> int:
        return sum(r.served == KERNEL for r in self.regions)

    def to_json(self) -> dict[str, Any]:
        return {"regions": [asdict(r) for r in self.regions], "fallbacks": list(self.fallbacks),
                "kernels": self.kernels}

    def table(self, title: str = "what the compile served") -> Any:
        from rich.table import Table

        t = Table(title=title)
        for col in ("graph", "#", "kind", "key", "operations", "served", "why"):
            t.add_column(col, overflow="fold")
        for r in self.regions:
            colour = {KERNEL: "green", EAGER_OPS: "cyan"}.get(r.served, "yellow")
            t.add_row(str(r.graph), "-" if r.index < 0 else str(r.index), r.kind, (r.key or "-")[:16], r.ops,
                      f"[{colour}]{r.served}[/]", r.why)
        return t

    def __str__(self) -> str:
        return render(self.table())


def served(clear: bool = False) -> Served:
    """What the compiles this process made with ``backend="kernelsmith"`` served (the last 256 graphs), region by
    region. Compiles happen on a model's first call, and again where Dynamo recompiles. ``clear``: forget these
    compiles after reading them, so that the next call shows only later ones."""
    result = Served.from_reports(compile_reports())
    if clear:
        clear_reports()
    return result
