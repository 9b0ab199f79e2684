"""A stored kernel launched as the judge ran it: its judged launch plan, with Triton kernels built from its source.

The judge never executes a candidate's Python forward: the candidate's process records a launch plan, and the
trusted side executes that plan with the candidate's Triton kernels alone (``ks_inductor.judge.plan``). The stored
kernel carries the plan the verdict was reached with (``KernelRecord.plan``), so at the judged signature a served
call (a pack kernel in a serving stack, a cached kernel in a compiled graph's op) runs exactly that: the same steps,
grids and arguments, and of the source only what ``kernel_source.kernels_module`` keeps (the ``triton.jit``
functions and literal constants). The kernel's forward, and any other code of its module, never runs there: a
forward that behaves one way while it is recorded and another way later has nothing to act on.

The plan declines any call not at the judged signature (shapes, dtypes, strides), and one whose inputs start inside
their storage (a storage offset): its views are relative to storages that begin where the inputs did when it was
recorded. Such a call takes the kernel's forward; a serving stack proves that forward against its own computation at
each signature other than the problem's first (``integrations.served_op``).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import torch

from ks_inductor.signature import Signature, call_signature, spec_signature

if TYPE_CHECKING:
    from kernel_cache.record import KernelRecord
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)


class JudgedPlanError(ValueError):
    """A stored plan that cannot run here: one line that says why."""


class JudgedPlan:
    """``plan(*inputs)``: the kernel's outputs at its judged signature, from its judged launch plan; None for a call
    off that signature or with an input that does not start its storage (the caller then runs the kernel's
    forward)."""

    def __init__(self, record: KernelRecord, signature: Signature) -> None:
        from ks_inductor.judge.kernel_source import KernelSourceError, kernels_module
        from ks_inductor.source_module import load_source_module

        self.plan, self.payload = checked_plan(record.plan, record.source, len(signature))
        try:
            # A module of its own making, under a name apart from the full source's (``kernel_ops.load_kernel``).
            self.kernels = load_source_module(kernels_module(record.source), "ks_judged")
        except KernelSourceError as e:
            raise JudgedPlanError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - a kernels module that does not import is a plan that cannot run
            raise JudgedPlanError(f"its kernels do not import: {type(e).__name__}: {e}") from None
        self.signature = signature
        self._runners: dict[torch.device, Any] = {}
        self._lock = threading.Lock()

    def runner(self, device: torch.device) -> Any:
        from ks_inductor.judge.plan import PlanError, PlanRunner

        got = self._runners.get(device)
        if got is None:
            with self._lock:
                got = self._runners.get(device)
                if got is None:
                    try:
                        got = PlanRunner(self.plan, self.kernels, self.payload, str(device), len(self.signature))
                    except PlanError as e:
                        raise JudgedPlanError(str(e)) from None
                    self._runners[device] = got
        return got

    def __call__(self, *args: Any) -> Any:
        # The plan's views fit the judged signature's tensors, starting their storages, and nothing else.
        for a in args:
            if not isinstance(a, torch.Tensor) or a.storage_offset():
                return None
        if call_signature(args) != self.signature:
            return None
        outs = self.runner(args[0].device)(*args)
        return outs[0] if len(outs) == 1 else tuple(outs)


def checked_plan(plan_json: str, source: str, n_inputs: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """The judged plan in ``plan_json`` and the bytes of its constants, checked without running anything against a
    kernel with this source and ``n_inputs`` inputs; ``JudgedPlanError`` for a plan that is malformed, reads the
    model's own tensors, comes without a constant's bytes, or launches a kernel the source does not define as a
    Triton kernel."""
    from ks_inductor.judge.kernel_source import KernelSourceError, kernel_names
    from ks_inductor.judge.plan import Plan, PlanError

    try:
        plan = Plan.from_json(plan_json)
        plan.validate(n_inputs)
        defined = set(kernel_names(source))
        raw = json.loads(plan_json).get("payload") or {}
        payload = {k: torch.frombuffer(bytearray(base64.b64decode(v, validate=True)), dtype=torch.uint8)
                   for k, v in raw.items()}
    except (PlanError, KernelSourceError, SyntaxError, ValueError, TypeError, AttributeError) as e:
        raise JudgedPlanError(f"its judged plan is malformed: {e}") from None
    for sid, st in enumerate(plan.storages):
        if st["kind"] == "state":
            raise JudgedPlanError("its judged plan reads the model's own tensors")
        got = payload.get(f"s{sid}")
        if st["kind"] == "const" and (got is None or got.numel() != st["nbytes"]):
            raise JudgedPlanError(f"its judged plan comes without the {st['nbytes']} bytes of its constant {sid}")
    unknown = sorted(plan.kernel_names() - defined)
    if unknown:
        raise JudgedPlanError(f"its judged plan launches {', '.join(unknown)}, which its source does not define as "
                              "Triton kernels")
    return plan, payload


def plan_fault(plan_json: str, source: str, n_inputs: int) -> str:
    """Why ``plan_json`` cannot be the judged plan of a kernel with this source and ``n_inputs`` inputs
    (``checked_plan``); "" where it can, or there is no plan."""
    if not plan_json:
        return ""
    try:
        checked_plan(plan_json, source, n_inputs)
    except JudgedPlanError as e:
        return str(e)
    return ""


def judged_plan(record: KernelRecord, problem: Problem) -> tuple[JudgedPlan | None, str]:
    """The record's judged plan at its problem's signature, ready to run, and ""; or None and why it has none that
    runs here."""
    if not record.plan:
        return None, "its record carries no judged plan"
    signature = spec_signature(problem.input_specs)
    if signature is None:
        return None, "its problem's inputs are not all tensors"
    try:
        return JudgedPlan(record, signature), ""
    except JudgedPlanError as e:
        log.warning("kernelsmith: kernel %s keeps its forward: its judged plan cannot run here (%s)",
                    record.sha256[:12], e)
        return None, f"its judged plan cannot run here: {e}"
