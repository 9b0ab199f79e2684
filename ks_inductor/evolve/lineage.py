"""How a search reached its winner: the steps from a seed to the program, each with the operator (or parameter
move, LLM edit) that made it and its gain, and the winning move among them (the step that gained most)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ks_inductor.evolve.operators.feedback import step_gain


@dataclass
class LineageStep:
    """One step on the way to a program: ``operator`` is the child's mutation ("split_k", "param", "llm-diff",
    ...); ``gain`` the child's score over the parent's where both were timed and correct, else None."""

    operator: str
    parent_id: str
    child_id: str
    gain: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def lineage(archive: Any, program_id: str) -> list[LineageStep]:
    """The steps from the seed that started ``program_id``'s line to it, the seed's child first; empty for a seed
    or a program the archive does not hold. A parent missing from the archive ends the walk there."""
    programs = getattr(archive, "programs", {}) or {}
    out: list[LineageStep] = []
    seen: set[str] = set()
    prog = programs.get(program_id)
    while prog is not None and prog.id not in seen:
        seen.add(prog.id)
        cand = prog.candidate or {}
        parent = programs.get(cand.get("parent_id") or "")
        if parent is None:
            break
        out.append(LineageStep(cand.get("mutation") or "", parent.id, prog.id, step_gain(parent, prog)))
        prog = parent
    return out[::-1]


def winning_move(steps: list[LineageStep]) -> LineageStep | None:
    """The step that gained most on the way, where one gained at all (a gain above 1); None where the winner is a
    seed or no step was timed."""
    gained = [s for s in steps if s.gain is not None and s.gain > 1.0]
    return max(gained, key=lambda s: s.gain or 0.0) if gained else None
