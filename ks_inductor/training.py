"""Trajectories to training data: the correctness-preserving, high-gain revisions of evolution runs, each with the
hardware that timed it.

Every step is read with what the cache stored about it: the fingerprint of the device its child was judged on (the
step's own, else the one the judge stamped on the child's stored verdict), the parent's and the child's stored
verdicts (their timings with the spread, speedups and lower confidence bounds), and the line of its run's winner.
A step is kept when the parent and the child were both correct on every validation input, both were timed on a
known device, the child's lower-bound speedup is at least the parent's speedup times (1 + min_gain) on every shape
set the same revision was judged on, and the child's timing noise (IQR / median) is at most ``max_noise``. Every
other step counts under exactly one reason of ``DROP_REASONS`` (the first that applies), so the reasons add up to
the steps read, per operator and per device.

Steps made by the embedded mutator get the prompt the local improver would have seen (the device from their
fingerprint, the parent's metrics and the judge's feedback on it from its stored verdict) and their change written
as SEARCH/REPLACE blocks, so they train the same local-improver behaviour as LLM steps, which keep their own prompt.

SFT rows are chat ``messages``; RL rows carry the reference code and the parent code, laid out like Kernel-Smith's
released datasets (``data_source``, ``prompt``, ``reward_model.ground_truth``, ``extra_info.parent_code``). Every
row names its move (a structural operator of ``ks_inductor.evolve.operators``, "param", "tweak", or ``llm`` for an
LLM edit), the parent's and the child's measurements, the hardware, the winner's line, and the judge's verdict on
the child (what a reward function reads). A dataset card (markdown) is written beside the rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_cache.record import StepRecord
from ks_core.fingerprint import EnvFingerprint
from ks_inductor.candidate import normalized_source_hash
from ks_inductor.evolve.diffs import make_blocks
from ks_inductor.evolve.prompts import SYSTEM, build_messages, fingerprint_facts, problem_info

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)

FORMATS = ("sft", "rl")
LLM = "llm"
NO_HARDWARE = "no hardware"

# Why a step is not a row, in the order they are checked: a step counts under the first that applies.
DROP_REASONS: dict[str, str] = {
    "not_revision": "not a revision (a seed, or a mutation that made no child)",
    "incorrect": "incorrect (the child was not accepted as correct)",
    "untimed": "untimed (the parent or the child has no timed speedup)",
    "no_hardware": "no hardware (no fingerprint stored with the step or with its child's verdict)",
    "gain": "gain below --min-gain",
    "noise": "within noise (the child's timing IQR/median above --max-noise)",
    "other_shapes": "the same revision fell short on another shape set",
}


def reason_label(reason: str) -> str:
    """A drop reason in a few words ("gain below --min-gain")."""
    return DROP_REASONS[reason].split(" (")[0]


def move_of(mutation: str) -> str:
    """The step's move: a structural operator's name ("split_k", ...), a parameter move ("param", "tweak"), or
    ``llm`` for every LLM edit ("llm-diff", "llm-rewrite", "llm-seed")."""
    return LLM if mutation.startswith(LLM) else mutation


@dataclass
class Tally:
    """Steps read, kept, and dropped by reason."""

    steps: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str | None) -> None:
        self.steps += 1
        if reason is None:
            self.kept += 1
        else:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "kept": self.kept, "dropped": dict(self.dropped)}


@dataclass
class OperatorStats(Tally):
    """One move's steps: the tally, how many children were correct, and the best gain among them."""

    correct: int = 0
    best_gain: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "correct": self.correct, "best_gain": self.best_gain}


@dataclass
class ExportStats:
    """What an export read, kept and dropped, by reason, move and device; and how it was asked for."""

    steps: int = 0
    kept: int = 0
    rows: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    operators: dict[str, OperatorStats] = field(default_factory=dict)
    devices: dict[str, Tally] = field(default_factory=dict)
    format: str = ""
    min_gain: float | None = None
    max_noise: float | None = None
    keys: list[str] | None = None
    source: str = ""
    output: str = ""
    card: str = ""
    command: str = ""

    def record(self, ev: StepEvidence, reason: str | None) -> None:
        s = ev.step
        self.steps += 1
        if reason is None:
            self.kept += 1
        else:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1
        op = self.operators.setdefault(ev.move, OperatorStats())
        op.add(reason)
        op.correct += int(s.correct)
        g = gain_of(s)
        if g is not None and (op.best_gain is None or g > op.best_gain):
            op.best_gain = g
        self.devices.setdefault(ev.device, Tally()).add(reason)

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "output": self.output, "card": self.card, "source": self.source,
                "steps": self.steps, "kept": self.kept, "rows": self.rows, "dropped": dict(self.dropped),
                "filters": {"min_gain": self.min_gain, "max_noise": self.max_noise, "keys": self.keys},
                "operators": {k: v.to_json() for k, v in sorted(self.operators.items())},
                "devices": {k: v.to_json() for k, v in sorted(self.devices.items())}, "command": self.command}

    def drop_summary(self) -> str:
        """The reasons that dropped steps, one clause each, most first."""
        parts = [f"{n} {reason_label(r)}" for r, n in
                 sorted(self.dropped.items(), key=lambda kv: (-kv[1], list(DROP_REASONS).index(kv[0]))) if n]
        return ", ".join(parts) or "none"

    def operator_summary(self) -> str:
        """One line: the steps by move, most steps first (seeds are not steps)."""
        parts = []
        for name, op in sorted(self.operators.items(), key=lambda kv: (-kv[1].steps, kv[0])):
            if name == "seed":
                continue
            gain = f", best gain {op.best_gain:.3f}x" if op.best_gain is not None else ""
            parts.append(f"{name} {op.steps} ({op.correct} correct, {op.kept} kept{gain})")
        return "; ".join(parts)


@dataclass
class StepEvidence:
    """A step with what the cache stored about it: the fingerprint of the device that judged its child, the
    stored verdicts (evaluation rows: ``KernelStore.evaluations``) of its parent and child, and its run's winner's
    line (``line``)."""

    step: StepRecord
    fingerprint: EnvFingerprint | None = None
    parent_eval: dict[str, Any] | None = None
    child_eval: dict[str, Any] | None = None
    line: dict[str, Any] | None = None

    @classmethod
    def of(cls, step: StepRecord) -> StepEvidence:
        """The step with only what it stores itself."""
        return cls(step, _fingerprint(step.fingerprint))

    @property
    def move(self) -> str:
        return move_of(self.step.mutation)

    @property
    def device(self) -> str:
        fp = self.fingerprint
        return f"{fp.device_name} ({fp.capability}, {fp.backend})" if fp is not None else NO_HARDWARE

    @property
    def child_noise(self) -> float | None:
        if self.step.noise is not None:
            return self.step.noise
        return _measured(None, None, self.child_eval)["noise"]


def _fingerprint(data: Any) -> EnvFingerprint | None:
    """The stored fingerprint, or None where there is none or it names no device."""
    if not isinstance(data, dict):
        return None
    try:
        fp = EnvFingerprint.from_json(data)
    except (KeyError, TypeError):
        return None
    return fp if fp.device_name and fp.backend else None


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


def drop_reason(ev: StepEvidence, min_gain: float = 0.05, max_noise: float = 0.05) -> str | None:
    """Why this step alone is not a row (a key of ``DROP_REASONS``), or None."""
    s = ev.step
    if not s.parent_source or not s.child_source or s.parent_id is None:
        return "not_revision"
    # Parents come from the archive, which holds only programs correct on every trial.
    if not s.correct or s.verdict != "accepted":
        return "incorrect"
    if s.child_speedup_lcb is None or s.parent_speedup is None or (ev.fingerprint is not None
                                                                   and not ev.fingerprint.timed):
        return "untimed"
    if ev.fingerprint is None:
        return "no_hardware"
    if s.child_speedup_lcb < s.parent_speedup * (1.0 + min_gain):
        return "gain"
    noise = ev.child_noise
    if noise is None or noise > max_noise:
        return "noise"
    return None


def select_steps(steps: Sequence[StepRecord | StepEvidence], min_gain: float = 0.05, max_noise: float = 0.05,
                 stats: ExportStats | None = None) -> list[StepEvidence]:
    """The correctness-preserving, high-gain revisions among ``steps``; ``stats`` counts every step under its
    reason. A revision (the same parent and child source) is kept only where every step of it is."""
    st = stats if stats is not None else ExportStats()
    evs = [s if isinstance(s, StepEvidence) else StepEvidence.of(s) for s in steps]
    reasons = [drop_reason(ev, min_gain, max_noise) for ev in evs]
    by_rev: dict[str, list[int]] = defaultdict(list)
    for i, ev in enumerate(evs):
        if reasons[i] != "not_revision":
            by_rev[_revision_id(ev.step)].append(i)
    for idx in by_rev.values():
        if any(reasons[i] is not None for i in idx):
            for i in idx:
                reasons[i] = reasons[i] or "other_shapes"
    kept = []
    for ev, reason in zip(evs, reasons):
        st.record(ev, reason)
        if reason is None:
            kept.append(ev)
    return kept


# ---------------------------------------------------------------------------------------------- the cache's evidence


def _verdict_for(rows: list[dict[str, Any]], step: StepRecord, fingerprint_id: str | None) -> dict[str, Any] | None:
    """The stored verdict a step saw: on its device, the newest stored before the step, its own run's first."""
    rows = [r for r in rows if fingerprint_id is None or r["fingerprint_id"] == fingerprint_id]
    before = [r for r in rows if step.created_at is None or r["created_at"] <= step.created_at]
    pool = before or rows
    same_run = [r for r in pool if r["run_id"] == step.run_id]
    pick = same_run or pool
    return pick[-1] if pick else None


def _line(run: dict[str, Any] | None, step: StepRecord) -> dict[str, Any]:
    """Where the step stands on its run's winner's line (``EvolveSummary.lineage``)."""
    summary = (run or {}).get("summary")
    if not run or run.get("status") != "finished" or not isinstance(summary, dict):
        return {"run_id": step.run_id, "finished": False, "winner_id": None, "on_line": False, "position": None,
                "length": None, "winning_move": False}
    line = [st for st in summary.get("lineage") or [] if isinstance(st, dict)]
    best = summary.get("best") or {}
    winner = line[-1].get("child_id") if line else best.get("candidate_id")
    pos = next((i for i, st in enumerate(line)
                if st.get("parent_id") == step.parent_id and st.get("child_id") == step.child_id), None)
    won = summary.get("winning_move") or {}
    return {"run_id": step.run_id, "finished": True, "winner_id": winner,
            "winner_speedup": summary.get("best_speedup"), "on_line": pos is not None,
            "position": None if pos is None else pos + 1, "length": len(line),
            "winning_move": pos is not None and (won.get("parent_id"), won.get("child_id")) == (step.parent_id,
                                                                                                step.child_id)}


def gather(store: Any, steps: list[StepRecord]) -> list[StepEvidence]:
    """Each step with what ``store`` keeps about it (see :class:`StepEvidence`)."""
    evals: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for key in sorted({s.problem_key for s in steps}):
        for row in store.evaluations(problem_key=key):
            evals[(row["problem_key"], row["candidate_hash"])].append(row)
    runs = {r["id"]: r for r in store.runs(run_ids=sorted({s.run_id for s in steps}))} if steps else {}
    hashes: dict[str, str] = {}

    def verdict(source: str, s: StepRecord, fp: EnvFingerprint | None) -> dict[str, Any] | None:
        if not source:
            return None
        h = hashes.get(source)
        if h is None:
            h = hashes[source] = normalized_source_hash(source)
        return _verdict_for(evals.get((s.problem_key, h), []), s, fp.id if fp is not None else None)

    out = []
    for s in steps:
        ev = StepEvidence.of(s)
        ev.child_eval = verdict(s.child_source, s, ev.fingerprint)
        if ev.fingerprint is None and ev.child_eval is not None:
            ev.fingerprint = _fingerprint((ev.child_eval.get("result") or {}).get("fingerprint"))
        ev.parent_eval = verdict(s.parent_source, s, ev.fingerprint)
        ev.line = _line(runs.get(s.run_id), s)
        out.append(ev)
    return out


# ---------------------------------------------------------------------------------------------- rows


def _result(row: dict[str, Any] | None) -> dict[str, Any]:
    res = (row or {}).get("result")
    return res if isinstance(res, dict) else {}


def hardware_fields(fp: EnvFingerprint) -> dict[str, Any]:
    """The fingerprint as a row's structured hardware fields."""
    return {"device_name": fp.device_name, "capability": fp.capability, "sm_count": fp.sm_count,
            "warp_size": fp.warp_size, "backend": fp.backend, "torch_version": fp.torch_version,
            "triton_version": fp.triton_version, "toolchain": fp.toolchain, "fingerprint_id": fp.id}


def _measured(speedup: float | None, lcb: float | None, row: dict[str, Any] | None) -> dict[str, Any]:
    """A program's measurement at the step: the search's speedup and bound, and its stored verdict's timing with
    the spread (IQR, and IQR / median as ``noise``) and its speedups over each baseline."""
    res = _result(row)
    t = (res.get("timings") or {}).get("candidate") or {}
    med, iqr = t.get("median_ms"), t.get("iqr_ms")
    return {"speedup": speedup, "speedup_lcb": lcb, "median_ms": med, "iqr_ms": iqr, "min_ms": t.get("min_ms"),
            "timing_runs": t.get("n"), "noise": iqr / med if med and iqr is not None else None,
            "speedup_eager": res.get("speedup_eager"), "speedup_eager_lcb": res.get("speedup_eager_lcb"),
            "speedup_inductor": res.get("speedup_inductor"), "speedup_inductor_lcb": res.get("speedup_inductor_lcb"),
            "evaluation_id": row.get("id") if row else None}


def judgment(ev: StepEvidence) -> dict[str, Any]:
    """The judge's verdict on the child, as a reward function reads it: from the stored verdict where there is
    one (None for what it does not say), else the step's own verdict fields."""
    s, res = ev.step, _result(ev.child_eval)
    mm = res.get("mismatch")
    return {
        "verdict": res.get("verdict", s.verdict), "correct": bool(res.get("correct", s.correct)),
        "stage": res.get("stage"), "trials": res.get("trials"),
        "mismatch": {k: mm.get(k) for k in ("max_abs_error", "max_rel_error", "fraction_mismatched",
                                            "rel_l2_error")} if isinstance(mm, dict) else None,
        "flags": list(res["flags"]) if "flags" in res else None,
        "timed": res.get("timing_meaningful"), "final": res.get("final"), "faster": res.get("faster"),
        "speedup": s.child_speedup, "speedup_lcb": s.child_speedup_lcb, "gain": gain_of(s),
        "roofline_fraction": res.get("roofline_fraction"), "evaluation_id": ev.child_eval.get("id")
        if ev.child_eval else None,
    }


def _peaks(fp: EnvFingerprint) -> dict[str, float]:
    """The device's nominal peaks as the live prompt states them (the judge backend's table)."""
    from ks_core.fingerprint import BACKEND_CUDA, BACKEND_MACA
    from ks_inductor.judge.backends import TRITON_CUDA, TRITON_MACA, backend_for

    name = {BACKEND_CUDA: TRITON_CUDA, BACKEND_MACA: TRITON_MACA}.get(fp.backend)
    return backend_for(name).nominal_peaks(fp.device_name) if name else {}


def _feedback(result: dict[str, Any]) -> str:
    """The judge's feedback on the parent, as the search kept it for the improver's prompt."""
    if not result:
        return ""
    from ks_inductor.judge.verdict import EvalResult

    try:
        return EvalResult.from_json(result).feedback_text()[-3000:]
    except (KeyError, TypeError, ValueError) as e:  # a verdict stored by another version: the rest stands
        log.debug("no feedback from a stored verdict: %s", e)
        return ""


def _messages(ev: StepEvidence, reference: str, problem: Problem | None) -> list[dict[str, str]]:
    s = ev.step
    if s.prompt and s.response:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": s.prompt},
                {"role": "assistant", "content": s.response}]
    assert ev.fingerprint is not None
    info = problem_info(problem) if problem is not None else ""
    parent = _result(ev.parent_eval)
    metrics = {k: parent.get(k) for k in ("speedup_eager", "speedup_inductor", "roofline_fraction")}
    msgs = build_messages(reference, info, fingerprint_facts(ev.fingerprint, _peaks(ev.fingerprint)),
                          s.parent_source, metrics, s.parent_speedup, _feedback(parent), [])
    msgs.append({"role": "assistant", "content": make_blocks(s.parent_source, s.child_source)})
    return msgs


def to_rows(steps: Sequence[StepRecord | StepEvidence], fmt: str,
            problems: Mapping[str, Problem | None]) -> list[dict[str, Any]]:
    """Rows of ``fmt`` for ``steps`` (kept ones: each needs its hardware fingerprint)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    rows = []
    for item in steps:
        ev = item if isinstance(item, StepEvidence) else StepEvidence.of(item)
        s = ev.step
        if ev.fingerprint is None:
            raise ValueError(f"step {s.child_id or '?'} of run {s.run_id} has no hardware fingerprint; "
                             "select_steps drops such steps")
        prob = problems.get(s.problem_key)
        reference = prob.source if prob is not None else ""
        fields = {
            "operator": ev.move, "mutation": s.mutation, "parent_id": s.parent_id, "child_id": s.child_id,
            "gain": gain_of(s), "parent_speedup": s.parent_speedup, "child_speedup": s.child_speedup,
            "child_speedup_lcb": s.child_speedup_lcb, "noise": ev.child_noise,
            "parent": _measured(s.parent_speedup, s.parent_speedup_lcb, ev.parent_eval),
            "child": _measured(s.child_speedup, s.child_speedup_lcb, ev.child_eval),
            "hardware": hardware_fields(ev.fingerprint), "line": ev.line or _line(None, s),
            "judgment": judgment(ev),
        }
        if fmt == "sft":
            rows.append({"_id": s.run_id, "messages": _messages(ev, reference, prob), "problem_key": s.problem_key,
                         **fields})
        else:
            rows.append({
                "data_source": "kernel_rl",
                "prompt": _messages(ev, reference, prob)[:-1],
                "ability": "triton_kernel_optimization",
                "reward_model": {"style": "rule", "ground_truth": reference},
                "extra_info": {"entry_point": "ModelNew", "parent_code": s.parent_source,
                               "reference_code": reference, "problem_key": s.problem_key, "run_id": s.run_id,
                               **fields},
            })
    return rows


# ---------------------------------------------------------------------------------------------- the card


def card_path(out_path: str | Path) -> Path:
    """The dataset card written beside ``out_path``: ``steps.jsonl`` -> ``steps.card.md``."""
    out = Path(out_path)
    return out.with_name(out.stem + ".card.md")


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def render_card(stats: ExportStats) -> str:
    """The dataset card: what the rows are, the filters, the command, and the counts by move, device and reason."""
    name = Path(stats.output).name
    gain = "-" if stats.min_gain is None else f"{stats.min_gain:g}"
    noise = "-" if stats.max_noise is None else f"{stats.max_noise:g}"
    reasons = [r for r in DROP_REASONS if stats.dropped.get(r)]
    lines = [
        f"# {name}",
        "",
        f"{stats.rows} {stats.format} rows of kernelsmith evolution steps (one row per kept step), read from "
        f"{stats.source or 'a kernel cache'}: {stats.steps} steps read, {stats.kept} kept.",
        "",
        "Each row names its move (a structural operator, a parameter move, or `llm`), the parent's and the child's "
        "measured speedups with their spread, the hardware that timed it (device, capability, SM count, warp size, "
        "backend, torch and triton versions), the line of its run's winner, and the judge's verdict on the child.",
        "",
        "## Filters",
        "",
        f"- format: `{stats.format}`",
        f"- min gain: {gain} (kept: child speedup lower bound >= parent speedup x (1 + {gain}) on every shape set "
        "the revision was judged on)",
        f"- max noise: {noise} (kept: the child's timing IQR / median <= {noise})",
        "- problem keys: " + (", ".join(f"`{k}`" for k in stats.keys) if stats.keys else "all"),
        "- only steps whose parent and child were correct and timed on a device with a stored fingerprint",
        "",
        "## Command",
        "",
        "```",
        stats.command or "(called from Python: ks_inductor.training.export_trajectories)",
        "```",
        "",
        "## By move",
        "",
    ]
    lines += _table(["move", "steps", "kept", *reasons],
                    [[k, v.steps, v.kept, *(v.dropped.get(r, 0) for r in reasons)]
                     for k, v in sorted(stats.operators.items(), key=lambda kv: (-kv[1].steps, kv[0]))])
    lines += ["", "## By device", ""]
    lines += _table(["device", "steps", "kept", *reasons],
                    [[k, v.steps, v.kept, *(v.dropped.get(r, 0) for r in reasons)]
                     for k, v in sorted(stats.devices.items(), key=lambda kv: (-kv[1].steps, kv[0]))])
    lines += ["", "## Dropped", ""]
    lines += _table(["reason", "steps"], [[DROP_REASONS[r], stats.dropped[r]] for r in reasons] or [["none", 0]])
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def export_trajectories(store: Any, fmt: str, out_path: str | Path, min_gain: float = 0.05,
                        max_noise: float = 0.05, problem_key: str | Sequence[str] | None = None,
                        command: str = "") -> ExportStats:
    """Write the selected steps of every run in ``store`` (of ``problem_key`` only: one key or several) as JSON
    lines to ``out_path``, and the dataset card beside them (:func:`card_path`). ``command``: the command line the
    card names."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    keys = None if problem_key is None else [problem_key] if isinstance(problem_key, str) else list(problem_key)
    out = Path(out_path)
    stats = ExportStats(format=fmt, min_gain=min_gain, max_noise=max_noise, keys=keys,
                        source=str(getattr(store, "where", "")), output=str(out), card=str(card_path(out)),
                        command=command)
    steps = store.steps() if keys is None else [s for k in keys for s in store.steps(problem_key=k)]
    kept = select_steps(gather(store, steps), min_gain, max_noise, stats)
    problems = {k: store.get_problem(k) for k in {ev.step.problem_key for ev in kept}}
    rows = to_rows(kept, fmt, problems)
    stats.rows = len(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, "".join(json.dumps(r) + "\n" for r in rows))
    _write(card_path(out), render_card(stats))
    log.info("wrote %d %s rows to %s from %d steps", stats.rows, fmt, out, stats.steps)
    return stats
