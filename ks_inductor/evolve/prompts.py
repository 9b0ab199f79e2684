"""The local improver's prompt: the task, the hardware, the reference, the parent with its metrics and the
judge's feedback, the room left to its roofline floor, the changes already tried on the problem with their gains,
top and diverse inspirations, and the ask: one targeted change as SEARCH/REPLACE blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ks_core.fingerprint import EnvFingerprint
from ks_inductor.evolve.operators.feedback import OperatorRecord

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

SYSTEM = (
    "You are a Triton GPU kernel optimization engineer. You work inside an evolving system that improves a "
    "working Triton kernel one step at a time. Each step you make ONE targeted change to the current program "
    "(a launch parameter, a tiling, a fusion, an algorithmic change) that you expect to make it faster while "
    "keeping it exactly correct. The program must define `class ModelNew(nn.Module)` with the same constructor "
    "and parameters as the reference `Model`; its forward may only allocate tensors and launch @triton.jit "
    "kernels defined at the module's top level, and what it launches may depend on the inputs' shapes but never "
    "their values (the judge records the launches once and replays them): no torch compute, no try/except "
    "fallbacks, no threads or streams, no caching of results."
)

_ASK = (
    "Make one targeted change. Answer with one or more edit blocks in exactly this form:\n"
    "<<<<<<< SEARCH\n<lines copied exactly from the current program>\n=======\n<replacement lines>\n"
    ">>>>>>> REPLACE\n"
    "Every SEARCH section must match the current program exactly and occur once. If the change touches most "
    "of the program, you may instead give the whole new program in one ```python block."
)

_SEED_ASK = (
    "Write a first Triton implementation of this reference as a complete Python module defining ModelNew, in "
    "one ```python block. Correctness first; keep it simple and fully on-device."
)


def fingerprint_facts(fp: EnvFingerprint, peaks: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The hardware as a prompt states it: the fingerprint's device, and its nominal peaks where known (``peaks``:
    the judge backend's ``nominal_peaks``, with ``bandwidth`` in bytes/s and FLOP/s per dtype)."""
    peaks = dict(peaks or {})
    return {"device": fp.device_name, "backend": fp.backend, "capability": fp.capability, "sm_count": fp.sm_count,
            "warp_size": fp.warp_size, "bandwidth_Bps": peaks.get("bandwidth"),
            "peak_flops": {k: v for k, v in peaks.items() if k != "bandwidth"}, "timed": fp.timed}


def _fmt_hw(hw: dict[str, Any]) -> str:
    parts = [f"device {hw.get('device')}", f"{hw.get('sm_count')} SMs", f"warp size {hw.get('warp_size')}"]
    if hw.get("bandwidth_Bps"):
        parts.append(f"memory bandwidth about {hw['bandwidth_Bps'] / 1e12:.1f} TB/s")
    peaks = hw.get("peak_flops") or {}
    if peaks:
        parts.append("peak " + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in peaks.items()))
    if not hw.get("timed", True):
        parts.append("kernels run in the Triton interpreter here: only correctness is judged")
    return "; ".join(parts)


def _fmt_metrics(m: dict[str, Any], score: float | None) -> str:
    items = []
    if score is not None:
        items.append(f"speedup vs fastest baseline {score:.3f}x")
    for k in ("speedup_eager", "speedup_inductor", "roofline_fraction"):
        if m.get(k) is not None:
            items.append(f"{k} {m[k]:.3f}")
    return ", ".join(items) or "correct (no timing)"


def _fmt_room(m: dict[str, Any]) -> str | None:
    fraction = m.get("roofline_fraction")
    if not fraction:
        return None
    return (f"The current program reaches {100 * fraction:.1f}% of its roofline floor (the time its bytes and FLOPs "
            f"take at the device's peaks): at most {1 / fraction:.2f}x faster is possible.")


def _fmt_tried(tried: Mapping[str, OperatorRecord]) -> str:
    lines = []
    for name, rec in sorted(tried.items(), key=lambda kv: (-(kv[1].best_gain or 0.0), kv[0])):
        gain = f", best gain {rec.best_gain:.3f}x" if rec.best_gain is not None else ""
        lines.append(f"- {name}: {rec.tries} children, {rec.correct} correct{gain}")
    return "\n".join(lines)


def build_messages(reference: str, problem_info: str, hardware: dict[str, Any], parent_source: str,
                   parent_metrics: dict[str, Any], parent_score: float | None, feedback: str,
                   inspirations: list[tuple[str, str, str]],
                   tried: Mapping[str, OperatorRecord] | None = None) -> list[dict[str, str]]:
    """Chat messages for one improvement step. ``inspirations``: (label, metrics text, source); ``tried``: per step
    kind (a structural operator, "param", "llm-diff", ...) how its children fared on this problem so far, as
    ``operators.history`` counts them. A gain is a child's score over its parent's."""
    parts = [
        "# Hardware\n" + _fmt_hw(hardware),
        "# Reference (PyTorch, KernelBench format)\n```python\n" + reference.strip() + "\n```",
        "# Problem\n" + problem_info,
    ]
    for label, metrics, src in inspirations:
        parts.append(f"# {label} ({metrics})\n```python\n{src.strip()}\n```")
    parts.append("# Current program (" + _fmt_metrics(parent_metrics, parent_score) + ")\n```python\n"
                 + parent_source.strip() + "\n```")
    if feedback.strip():
        parts.append("# Judge's feedback on the current program\n" + feedback.strip()[-3000:])
    room = _fmt_room(parent_metrics)
    if room:
        parts.append("# Room\n" + room)
    if tried:
        parts.append("# Changes already tried on this problem (gain: child speedup over its parent's)\n"
                     + _fmt_tried(tried))
    parts.append("# Task\n" + _ASK)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def build_seed_messages(reference: str, problem_info: str, hardware: dict[str, Any]) -> list[dict[str, str]]:
    parts = ["# Hardware\n" + _fmt_hw(hardware),
             "# Reference (PyTorch, KernelBench format)\n```python\n" + reference.strip() + "\n```",
             "# Problem\n" + problem_info, "# Task\n" + _SEED_ASK]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def problem_info(problem: Problem) -> str:
    ops = ", ".join(f"{k} x{v}" for k, v in problem.op_summary.items())
    return (f"inputs {problem.signature()}; aten ops {ops}; about {problem.bytes_moved / 1e6:.1f} MB moved and "
            f"{problem.flops / 1e9:.2f} GFLOP")
