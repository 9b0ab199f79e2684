"""The population: islands of MAP-Elites cells over kernel-strategy descriptors, plus a global elite archive.

Noise must not decide: a child takes an occupied cell (or a place among the elites) only when the lower
confidence bound of its speedup beats the incumbent's speedup by ``margin``; elites are timed again and their
scores become the median of all their measurements. On an untimed backend (the interpreter) correctness is the
only signal: the first correct program of a cell keeps it.

All state is plain JSON, so a run resumes from the kernel cache after an interruption.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

DESCRIPTOR_AXES = ("block", "warps", "stages", "dot", "fusion", "persistent")


@dataclass
class Program:
    id: str
    source_hash: str
    candidate: dict[str, Any]  # Candidate.to_json()
    descriptor: dict[str, Any]
    island: int
    correct: bool
    timed: bool
    speedups: list[float] = field(default_factory=list)  # point speedup vs the best baseline, per measurement
    lcbs: list[float] = field(default_factory=list)
    median_ms: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    feedback: str = ""
    generation: int = 0
    migrated: bool = False

    @property
    def score(self) -> float:
        """Speedup against the fastest baseline (median over measurements); 1.0 where timing means nothing."""
        if not self.timed or not self.speedups:
            return 1.0 if self.correct else 0.0
        return float(statistics.median(self.speedups))

    @property
    def lcb(self) -> float:
        if not self.timed or not self.lcbs:
            return self.score
        return float(statistics.median(self.lcbs))

    @property
    def cell(self) -> str:
        return cell_key(self.descriptor)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Program:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def cell_key(descriptor: dict[str, Any]) -> str:
    parts = []
    for axis in DESCRIPTOR_AXES:
        v = descriptor.get(axis)
        if axis == "fusion" and isinstance(v, (int, float)):
            v = "full" if v >= 0.999 else ("most" if v >= 0.5 else "part")
        parts.append(f"{axis}={v}")
    return "|".join(parts)


class Archive:
    def __init__(self, islands: int = 2, elite_size: int = 12, margin: float = 0.02,
                 exploration: float = 0.2, exploitation: float = 0.6, migration_interval: int = 6) -> None:
        if islands < 1:
            raise ValueError("at least one island is needed")
        self.n_islands = islands
        self.elite_size = elite_size
        self.margin = margin
        self.exploration = exploration
        self.exploitation = exploitation
        self.migration_interval = migration_interval
        self.programs: dict[str, Program] = {}
        self.cells: list[dict[str, str]] = [{} for _ in range(islands)]
        self.elites: list[str] = []
        self.island_generations = [0] * islands
        self.seen: set[str] = set()
        self.failures: dict[str, int] = {}  # parent id -> failed children, to stop hammering a dead end

    # ------------------------------------------------------------------ bookkeeping
    def mark_seen(self, source_hash: str) -> None:
        self.seen.add(source_hash)

    def is_seen(self, source_hash: str) -> bool:
        return source_hash in self.seen

    def beats(self, child: Program, incumbent: Program) -> bool:
        """The displacement rule."""
        if not child.correct:
            return False
        if not incumbent.correct:
            return True
        if not (child.timed and incumbent.timed):
            return False
        return child.lcb > incumbent.score * (1.0 + self.margin)

    def add(self, prog: Program) -> bool:
        """Place a judged program; True when it took a cell or an elite place."""
        self.mark_seen(prog.source_hash)
        self.programs[prog.id] = prog
        if not prog.correct:
            return False
        placed = self._place(prog, prog.island)
        placed = self._consider_elite(prog) or placed
        return placed

    def _place(self, prog: Program, island: int) -> bool:
        cells = self.cells[island]
        key = prog.cell
        inc_id = cells.get(key)
        if inc_id is None or self.beats(prog, self.programs[inc_id]):
            cells[key] = prog.id
            return True
        return False

    def _consider_elite(self, prog: Program) -> bool:
        if prog.id in self.elites:
            self._sort_elites()
            return True
        if len(self.elites) < self.elite_size:
            self.elites.append(prog.id)
            self._sort_elites()
            return True
        worst = self.programs[self.elites[-1]]
        if self.beats(prog, worst):
            self.elites[-1] = prog.id
            self._sort_elites()
            return True
        return False

    def _sort_elites(self) -> None:
        self.elites.sort(key=lambda i: (-self.programs[i].score, -self.programs[i].lcb))

    def update_measurement(self, prog_id: str, speedup: float | None, lcb: float | None,
                           median_ms: float | None) -> None:
        """A re-timing of an elite: its score becomes the median over all measurements."""
        p = self.programs[prog_id]
        if speedup is not None:
            p.speedups.append(speedup)
        if lcb is not None:
            p.lcbs.append(lcb)
        if median_ms is not None:
            p.median_ms.append(median_ms)
        self._sort_elites()

    def demote(self, prog_id: str) -> None:
        """A program that failed a re-check leaves every cell and the elites."""
        p = self.programs.get(prog_id)
        if p is None:
            return
        p.correct = False
        self.elites = [e for e in self.elites if e != prog_id]
        for cells in self.cells:
            for k in [k for k, v in cells.items() if v == prog_id]:
                del cells[k]

    # ------------------------------------------------------------------ queries
    def best(self) -> Program | None:
        return self.programs[self.elites[0]] if self.elites else None

    def island_programs(self, island: int) -> list[Program]:
        return [self.programs[i] for i in dict.fromkeys(self.cells[island].values())]

    def correct_programs(self) -> list[Program]:
        return [p for p in self.programs.values() if p.correct]

    def select_parent(self, island: int, rng: random.Random) -> Program | None:
        """Mix exploitation (elites, preferring this island's), exploration (any cell of the island) and
        fitness-weighted choice among the island's cells."""
        members = self.island_programs(island)
        elites = [self.programs[e] for e in self.elites]
        if not members and not elites:
            return None
        r = rng.random()
        if members and r < self.exploration:
            return rng.choice(members)
        if elites and (r < self.exploration + self.exploitation or not members):
            local = [e for e in elites if e.island == island] or elites
            # Rank-weighted: the best elite is most likely, a dead-end parent less so.
            weights = [1.0 / (1 + i) / (1 + self.failures.get(e.id, 0) * 0.25) for i, e in enumerate(local)]
            return rng.choices(local, weights=weights, k=1)[0]
        weights = [max(m.score, 1e-3) for m in members]
        return rng.choices(members, weights=weights, k=1)[0]

    def repair_parent(self, rng: random.Random) -> Program | None:
        """While nothing is correct yet: a rejected program to move away from (a neighbour of a seed that failed
        on this device often passes; an LLM gets the judge's feedback), the least-mutated first."""
        rejected = [p for p in self.programs.values() if not p.correct]
        if not rejected:
            return None
        fewest = min(self.failures.get(p.id, 0) for p in rejected)
        return rng.choice([p for p in rejected if self.failures.get(p.id, 0) == fewest])

    def inspirations(self, parent: Program, n: int, rng: random.Random) -> list[Program]:
        """Top programs and programs from other cells (diverse strategies), never the parent itself."""
        out: list[Program] = []
        for e in self.elites:
            if e != parent.id and len(out) < max(1, n // 2):
                out.append(self.programs[e])
        others = [p for p in self.correct_programs() if p.id != parent.id and p not in out
                  and p.cell != parent.cell]
        rng.shuffle(others)
        for p in others:
            if len(out) >= n:
                break
            if all(q.cell != p.cell for q in out):
                out.append(p)
        return out

    def step_island(self, island: int) -> bool:
        """Count a generation on an island; True when it is time to migrate."""
        self.island_generations[island] += 1
        return self.n_islands > 1 and self.island_generations[island] % self.migration_interval == 0

    def migrate(self, island: int) -> list[str]:
        """Copy the island's best program into the next island of the ring (once per program)."""
        members = sorted(self.island_programs(island), key=lambda p: -p.score)
        moved = []
        target = (island + 1) % self.n_islands
        for p in members[:1]:
            if p.migrated:
                continue
            if self._place(p, target):
                p.migrated = True
                moved.append(p.id)
        return moved

    # ------------------------------------------------------------------ state
    def to_json(self) -> dict[str, Any]:
        return {
            "n_islands": self.n_islands, "elite_size": self.elite_size, "margin": self.margin,
            "exploration": self.exploration, "exploitation": self.exploitation,
            "migration_interval": self.migration_interval,
            "programs": {k: p.to_json() for k, p in self.programs.items()},
            "cells": self.cells, "elites": self.elites, "island_generations": self.island_generations,
            "seen": sorted(self.seen), "failures": self.failures,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Archive:
        a = cls(data["n_islands"], data["elite_size"], data["margin"], data["exploration"], data["exploitation"],
                data["migration_interval"])
        a.programs = {k: Program.from_json(v) for k, v in data["programs"].items()}
        a.cells = [dict(c) for c in data["cells"]]
        a.elites = list(data["elites"])
        a.island_generations = list(data["island_generations"])
        a.seen = set(data["seen"])
        a.failures = dict(data.get("failures", {}))
        return a
