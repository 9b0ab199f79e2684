"""Trajectories to training data: keep the correctness-preserving, high-gain revisions of evolution runs.

A step is kept when the parent and the child were both correct on every validation input, the child's
lower-bound speedup is at least the parent's speedup times (1 + min_gain) on every shape set the same revision
was judged on, and the child's timing noise (IQR / median) is under ``max_noise``. Steps made by the embedded
mutator get the prompt the local improver would have seen and their change written as SEARCH/REPLACE blocks,
so they train the same local-improver behaviour as LLM steps.

SFT rows are chat ``messages``; RL rows carry the reference code and the parent code, laid out like
Kernel-Smith's released datasets (``data_source``, ``prompt``, ``reward_model.ground_truth``,
``extra_info.parent_code``). Every row names its step: the operator that made the child (a structural operator of
``ks_inductor.evolve.operators``, "param", an LLM edit), the parent's and the child's ids, and the gain (the child's
score over the parent's). The export's statistics count every step by operator, kept or not.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_cache.record import StepRecord
from ks_inductor.evolve.diffs import make_blocks
from ks_inductor.evolve.prompts import SYSTEM, build_messages, problem_info

log = logging.getLogger(__name__)

FORMATS = ("sft", "rl")


@dataclass
class OperatorStats:
    """One operator's steps among those exported: how many, how many correct children, how many kept, and the best
    gain among its steps."""

    steps: int = 0
    correct: int = 0
    kept: int = 0
    best_gain: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ExportStats:
    steps: int = 0
    kept: int = 0
    dropped_incorrect: int = 0
    dropped_untimed: int = 0
    dropped_gain: int = 0
    dropped_noise: int = 0
    rows: int = 0
    operators: dict[str, OperatorStats] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "operators"}
        out["operators"] = {k: v.to_json() for k, v in self.operators.items()}
        return out

    def count(self, step: StepRecord, kept: bool = False) -> None:
        op = self.operators.setdefault(step.mutation, OperatorStats())
        if kept:
            op.kept += 1
            return
        op.steps += 1
        op.correct += int(step.correct)
        g = gain_of(step)
        if g is not None and (op.best_gain is None or g > op.best_gain):
            op.best_gain = g

    def operator_summary(self) -> str:
        """One line: the steps by operator, most steps first (seeds are not steps)."""
        parts = []
        for name, op in sorted(self.operators.items(), key=lambda kv: (-kv[1].steps, kv[0])):
            if name == "seed":
                continue
            gain = f", best gain {op.best_gain:.3f}x" if op.best_gain is not None else ""
            parts.append(f"{name} {op.steps} ({op.correct} correct, {op.kept} kept{gain})")
        return "; ".join(parts)


def gain_of(step: StepRecord) -> float | None:
    """The child's score over the parent's: the step's own, else from its speedups where both were measured."""
    if step.gain is not None:
        return step.gain
    if step.correct and step.parent_speedup and step.child_speedup is not None:
        return step.child_speedup / step.parent_speedup
    return None


def _revision_id(step: StepRecord) -> str:
    h = hashlib.sha256((step.parent_source + "\x00" + step.child_source).encode()).hexdigest()
    return h[:16]


def select_steps(steps: list[StepRecord], min_gain: float = 0.05, max_noise: float = 0.05,
                 stats: ExportStats | None = None) -> list[StepRecord]:
    """The correctness-preserving, high-gain revisions among ``steps``."""
    st = stats or ExportStats()
    by_rev: dict[str, list[StepRecord]] = defaultdict(list)
    for s in steps:
        st.steps += 1
        st.count(s)
        if not s.parent_source or not s.child_source or s.parent_id is None:
            st.dropped_incorrect += 1  # seeds and failed steps are not revisions
            continue
        by_rev[_revision_id(s)].append(s)
    kept: list[StepRecord] = []
    for group in by_rev.values():
        reason = None
        for s in group:
            # Parents come from the archive, which holds only programs correct on every trial.
            if not s.correct or s.verdict != "accepted":
                reason = "incorrect"
                break
            if s.child_speedup_lcb is None or s.parent_speedup is None:
                reason = "untimed"
                break
            if s.child_speedup_lcb < s.parent_speedup * (1.0 + min_gain):
                reason = "gain"
                break
            if s.noise is None or s.noise > max_noise:
                reason = "noise"
                break
        if reason is None:
            kept.extend(group)
            st.kept += len(group)
            for s in group:
                st.count(s, kept=True)
        else:
            setattr(st, f"dropped_{reason}", getattr(st, f"dropped_{reason}") + len(group))
    return kept


def _messages(step: StepRecord, reference: str, problem: Any) -> list[dict[str, str]]:
    if step.prompt and step.response:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": step.prompt},
                {"role": "assistant", "content": step.response}]
    info = problem_info(problem) if problem is not None else ""
    msgs = build_messages(reference, info, {"device": "GPU", "timed": True}, step.parent_source,
                          {}, step.parent_speedup, "", [])
    msgs.append({"role": "assistant", "content": make_blocks(step.parent_source, step.child_source)})
    return msgs


def to_rows(steps: list[StepRecord], fmt: str, problems: dict[str, Any]) -> list[dict[str, Any]]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    rows = []
    for s in steps:
        prob = problems.get(s.problem_key)
        reference = prob.source if prob is not None else ""
        gain = {"operator": s.mutation, "parent_id": s.parent_id, "child_id": s.child_id, "gain": gain_of(s),
                "parent_speedup": s.parent_speedup, "child_speedup": s.child_speedup,
                "child_speedup_lcb": s.child_speedup_lcb, "noise": s.noise}
        if fmt == "sft":
            rows.append({"_id": s.run_id, "messages": _messages(s, reference, prob), "problem_key": s.problem_key,
                         "mutation": s.mutation, **gain})
        else:
            msgs = _messages(s, reference, prob)[:-1]
            rows.append({
                "data_source": "kernel_rl",
                "prompt": msgs,
                "ability": "triton_kernel_optimization",
                "reward_model": {"style": "rule", "ground_truth": reference},
                "extra_info": {"entry_point": "ModelNew", "parent_code": s.parent_source,
                               "reference_code": reference, "problem_key": s.problem_key, "run_id": s.run_id,
                               "mutation": s.mutation, **gain},
            })
    return rows


def export_trajectories(store: Any, fmt: str, out_path: str | Path, min_gain: float = 0.05,
                        max_noise: float = 0.05, problem_key: str | Sequence[str] | None = None) -> ExportStats:
    """Write the selected steps of every run in ``store`` (of ``problem_key`` only: one key or several) as JSON
    lines."""
    stats = ExportStats()
    if problem_key is None:
        steps = store.steps()
    else:
        keys = [problem_key] if isinstance(problem_key, str) else list(problem_key)
        steps = [s for k in keys for s in store.steps(problem_key=k)]
    kept = select_steps(steps, min_gain, max_noise, stats)
    problems = {k: store.get_problem(k) for k in {s.problem_key for s in kept}}
    rows = to_rows(kept, fmt, problems)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(out)
    stats.rows = len(rows)
    return stats
