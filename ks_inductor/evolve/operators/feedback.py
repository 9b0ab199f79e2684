"""What the operators weigh: the judge's word on a parent (its roofline fraction), whether the problem is memory- or
compute-bound on the device, and the shape of its work (rows against row length, programs against SMs), read from
the family match so that no operator parses shapes of its own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ks_inductor.seeds.families import FamilyMatch

# Values a row holds from which a row counts as long (one program's registers fill with it, so few programs fit on
# an SM), and up to which it counts as short (a program holding one row leaves most of its lanes idle).
LONG_ROW = 8192
SHORT_ROW = 1024
# Values one program's tile should hold where rows are short: the row-wise template's default tile (docs/findings.md,
# "Row-wise norms").
TILE_VALUES = 8192
# SMs assumed where the hardware facts name none: an H100/H200 on a GPU, the interpreter's stand-in count on CPU
# (``SM_COUNT_HELPER`` in the templates).
GPU_SMS = 132
INTERPRETER_SMS = 4
# FLOP per byte above which a problem is compute-bound where the device's peaks are unknown (an H100 at bf16 has
# about 295, an A100 about 150; fp32 halves both).
DEFAULT_RIDGE = 100.0
# The share of the floor below which a parent counts as far from it.
FAR_FROM_FLOOR = 0.6


@dataclass
class OperatorRecord:
    """How an operator (or any other step kind) fared on one problem so far: the children it made, the correct
    ones, and its best gain (child score over parent score, timed children only)."""

    tries: int = 0
    correct: int = 0
    best_gain: float | None = None

    def add(self, correct: bool, gain: float | None) -> None:
        self.tries += 1
        self.correct += int(correct)
        if gain is not None and (self.best_gain is None or gain > self.best_gain):
            self.best_gain = gain

    def to_json(self) -> dict[str, Any]:
        return {"tries": self.tries, "correct": self.correct, "best_gain": self.best_gain}


@dataclass
class Feedback:
    """The facts an operator's ``score`` reads. ``rows``: independent rows (groups, heads, product rows); ``row_len``:
    the values each reduces (K for a product, the key/value length for attention); ``programs``: what a grid of one
    tile per program launches at the parent's tile."""

    family: str = ""
    roofline_fraction: float | None = None
    bound: str | None = None  # "memory" or "compute"; None where the problem's counts are unknown
    rows: int = 1
    row_len: int = 1
    cols: int = 1
    programs: int = 1
    sm_count: int = GPU_SMS
    params: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    tried: dict[str, OperatorRecord] = field(default_factory=dict)

    @property
    def room(self) -> float:
        """How far the parent is from its floor, 0 (at it) to 1; 0.5 where no judgment measured it."""
        if self.roofline_fraction is None:
            return 0.5
        return min(1.0, max(0.0, 1.0 - self.roofline_fraction))

    @property
    def far_from_floor(self) -> bool:
        return self.roofline_fraction is not None and self.roofline_fraction < FAR_FROM_FLOOR

    @property
    def memory_bound(self) -> bool:
        return self.bound != "compute"

    @property
    def waves(self) -> float:
        """Programs per SM of a grid of one tile per program."""
        return self.programs / max(1, self.sm_count)

    @property
    def few_long_rows(self) -> bool:
        return self.rows < self.sm_count and self.row_len >= LONG_ROW

    @property
    def many_short_rows(self) -> bool:
        return self.rows >= 4 * self.sm_count and self.row_len <= SHORT_ROW


def feedback_for(fm: FamilyMatch, parent: Any = None, hardware: dict[str, Any] | None = None,
                 archive: Any = None) -> Feedback:
    """The facts for a step from ``parent`` (an archive ``Program``, or None before any judgment): its metrics and
    parameters, the problem's shape from ``fm``, the device from ``hardware`` (``evolver.hardware_facts``) and, from
    ``archive``, how each operator fared on this problem so far."""
    from ks_inductor.candidate import Candidate

    hw = hardware or {}
    sms = int(hw.get("sm_count") or 0) or (INTERPRETER_SMS if fm.target == "cpu" else GPU_SMS)
    params: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    if parent is not None:
        metrics = dict(getattr(parent, "metrics", {}) or {})
        params = dict(Candidate.from_json(parent.candidate).params) if getattr(parent, "candidate", None) else {}
    rows, row_len, cols = work_shape(fm)
    fraction = metrics.get("roofline_fraction")
    return Feedback(family=fm.family, roofline_fraction=float(fraction) if fraction is not None else None,
                    bound=_bound(fm, hw), rows=rows, row_len=row_len, cols=cols,
                    programs=_programs(fm, params, rows, cols), sm_count=sms, params=params, attrs=dict(fm.attrs),
                    tried=history(archive) if archive is not None else {})


def history(archive: Any) -> dict[str, OperatorRecord]:
    """Per step kind (an operator's name, "param", "llm-diff", ...): its children in ``archive`` and its best gain.
    Seeds are not steps."""
    out: dict[str, OperatorRecord] = {}
    programs = getattr(archive, "programs", {}) or {}
    for prog in programs.values():
        cand = prog.candidate or {}
        parent = programs.get(cand.get("parent_id") or "")
        kind = cand.get("mutation") or ""
        if parent is None or not kind:
            continue
        out.setdefault(kind, OperatorRecord()).add(bool(prog.correct), step_gain(parent, prog))
    return out


def step_gain(parent: Any, child: Any) -> float | None:
    """Child score over parent score, where both were timed and correct; None otherwise."""
    if not (parent.timed and child.timed and parent.correct and child.correct) or parent.score <= 0:
        return None
    return child.score / parent.score


def _bound(fm: FamilyMatch, hw: dict[str, Any]) -> str | None:
    problem = fm.problem
    moved, flops = getattr(problem, "bytes_moved", 0), getattr(problem, "flops", 0)
    if not moved:
        return None
    peaks = [v for v in (hw.get("peak_flops") or {}).values() if v]
    ridge = max(peaks) / hw["bandwidth_Bps"] if peaks and hw.get("bandwidth_Bps") else DEFAULT_RIDGE
    return "compute" if flops / moved >= ridge else "memory"


def work_shape(fm: FamilyMatch) -> tuple[int, int, int]:
    """(rows, row length, columns) of ``fm``'s work, per family; for a family with no reduction, rows and length
    of its largest output."""
    a, g = fm.attrs, fm.graph
    try:
        if fm.family == "attention":
            seq = _attention_keys(fm)
            return a["B"] * a["HK"], seq, a["H"] // a["HK"] * a["TQ"]
        if fm.family == "matmul":
            t = g.type_of(a["mm"])
            node = g.node(a["mm"])
            left = node.args[1] if node is not None and node.op in ("addmm", "baddbmm") else node.args[0]
            k = g.type_of(left.name).shape[-1]  # type: ignore[union-attr]
            return t.numel // t.shape[-1], k, t.shape[-1]  # type: ignore[union-attr]
        if fm.family == "group_norm":
            return int(a["rows"]), int(a["length"]), 1
        if fm.family == "cross_entropy":
            r, n = g.type_of(a["logits"]).shape  # type: ignore[union-attr]
            return r, n, 1
        if fm.family == "total":
            return 1, g.type_of(a["src"]).numel, 1  # type: ignore[union-attr]
        if fm.family in ("reduction", "scan") and "dim" in a:
            t = g.type_of(a.get("x") or a.get("tail"))
            n = t.shape[a["dim"]]  # type: ignore[union-attr]
            return t.numel // max(1, n), n, 1  # type: ignore[union-attr]
    except (KeyError, AttributeError, IndexError, TypeError, ValueError):
        pass
    return _row_shape(fm)


def _attention_keys(fm: FamilyMatch) -> int:
    from ks_inductor.canonical_ops import SDPA_TARGET

    for n in fm.graph.nodes:
        if n.target == SDPA_TARGET:
            return fm.graph.type_of(n.args[1].name).shape[2]  # type: ignore[union-attr]
    raise KeyError("no attention node")


def _row_shape(fm: FamilyMatch) -> tuple[int, int, int]:
    """Rows and row length of the largest tensor among the inputs and outputs, the row being the dims the match
    reduces (the last one where it names none)."""
    types = [t for _, t in fm.graph.placeholders if t is not None and t.shape]
    types += [t for t in fm.outputs if t is not None and t.shape]
    if not types:
        return 1, 1, 1
    t = max(types, key=lambda x: x.numel)
    first, last = fm.row_dims
    ndim = len(t.shape)
    first, last = min(first, ndim - 1), min(last, ndim - 1)
    n = math.prod(t.shape[first:last + 1]) if first <= last else t.shape[-1]
    return max(1, t.numel // max(1, n)), max(1, n), 1


def _programs(fm: FamilyMatch, params: dict[str, Any], rows: int, cols: int) -> int:
    if fm.family == "matmul":
        bm, bn = int(params.get("BLOCK_M", 64)), int(params.get("BLOCK_N", 64))
        return -(-rows // bm) * -(-cols // bn)
    if fm.family in ("pointwise", "act_mul"):
        numel = max((t.numel for t in fm.outputs if t is not None), default=rows)
        return -(-numel // int(params.get("BLOCK", 2048)))
    return -(-rows // int(params.get("ROWS", 1)))


def facts(fm: FamilyMatch, fb: Feedback | None) -> Feedback:
    """``fb``, or the shape facts alone where no feedback was given (an operator applied outside a search)."""
    return fb if fb is not None else feedback_for(fm)
