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
recorded. Such a call is computed by the caller's own path (the stack's layer, the region's reference), never by the
forward. At a signature other than the problem's that an op's free dims allow (a decode step's cache length), a
serving stack records the forward's launches once, runs that record as a plan (``JudgedPlan.of``) and proves it
against its own computation there before it serves (``integrations.checks.plan_at``): there too what serves is a
plan that was checked, not the forward.

A compiled graph that calls the kernel from Inductor's own code (a ``triton_op``) traces the plan, not the forward
(``JudgedPlan.traced``): a forward that tells a tracer's tensors from real ones would otherwise put code the judge
never saw into the graph. The traced plan views each storage through one tensor of one dtype, so a plan that reads a
storage as two dtypes, views a buffer with elements that share memory, carries constants or launches with a tensor
descriptor is not traced (``JudgedPlan.untraceable``); its op runs the plan per call instead.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator, Sequence
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

    @classmethod
    def of(cls, plan: Any, payload: dict[str, torch.Tensor], kernels: Any, signature: Signature) -> JudgedPlan:
        """A plan recorded outside the judge (a served kernel's launches at a signature it is proven at), run as a
        judged one is: ``kernels`` built from the kernel's source alone, ``payload`` the bytes of its constants."""
        from ks_inductor.judge.plan import PlanError

        if any(st["kind"] == "state" for st in plan.storages):
            raise JudgedPlanError("the plan reads the model's own tensors")
        try:
            plan.validate(len(signature))
        except PlanError as e:
            raise JudgedPlanError(f"the plan is malformed: {e}") from None
        self = cls.__new__(cls)
        self.plan, self.payload, self.kernels, self.signature = plan, payload, kernels, signature
        self._runners = {}
        self._lock = threading.Lock()
        return self

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

    def untraceable(self, example: Sequence[Any]) -> str:
        """Why a ``triton_op`` cannot trace this plan (``traced``) for calls like ``example`` (a region's example
        values, real or fake); "" where it can."""
        if not all(isinstance(a, torch.Tensor) for a in example):
            return "an input is not a tensor"
        if not all(type(n) is int for a in example for n in (*a.shape, *a.stride(), a.storage_offset())):
            return "its inputs' sizes are symbolic"
        if any(a.storage_offset() for a in example) or call_signature(example) != self.signature:
            return "the region's inputs are not at the judged signature"
        if any(s["kind"] not in ("input", "alloc") for s in self.plan.storages):
            return "its plan carries constants"
        dtypes: dict[int, set[str]] = {}
        for v in _plan_views(self.plan):
            if v is None:
                return "its plan launches with a tensor descriptor"
            dtypes.setdefault(v["storage"], set()).add(v["dtype"])
        for v in _plan_views(self.plan):
            if v is not None and self.plan.storages[v["storage"]]["kind"] == "alloc" and _overlaps(v["shape"],
                                                                                                   v["stride"]):
                # A traced write through a view whose elements share memory becomes a write to a clone of it, whose
                # elements do not: the graph would compute what the judge did not.
                return "its plan views a buffer with elements that share memory"
        for sid, names in dtypes.items():
            st, dt = self.plan.storages[sid], getattr(torch, next(iter(names)))
            if len(names) > 1:
                return f"its plan reads storage {sid} as {' and '.join(sorted(names))}"
            if st["kind"] == "input":
                x = example[st["index"]]
                if dt != x.dtype or st["nbytes"] > _span(x.shape, x.stride()) * x.element_size():
                    return f"its plan reads input {st['index']} other than as the input it is"
            elif st["nbytes"] % dt.itemsize:
                return f"its plan's buffer {sid} is no whole number of {dt}"
        return ""

    def traced(self, *args: Any) -> Any:
        """The plan's outputs for ``args``, made of what a tracer follows: each storage is one tensor (an input, or a
        fresh allocation in the one dtype the plan reads it as, laid out as its first view where that covers it),
        each other view its ``as_strided``, each launch through ``wrap_triton``. For a call at the judged signature
        where ``untraceable`` found nothing."""
        from torch.library import wrap_triton

        from ks_inductor.judge.plan import run_steps

        device = args[0].device
        dtypes: dict[int, str] = {}
        first: dict[int, dict[str, Any]] = {}
        for v in _plan_views(self.plan):
            if v is not None:
                dtypes.setdefault(v["storage"], v["dtype"])
                first.setdefault(v["storage"], v)
        bases: list[torch.Tensor] = []
        own: dict[int, dict[str, Any]] = {}  # storage -> the view that is its base tensor itself
        for sid, st in enumerate(self.plan.storages):
            if st["kind"] == "input":
                x = args[st["index"]]
                bases.append(x)
                own[sid] = {"storage": sid, "dtype": dtypes.get(sid), "shape": list(x.shape),
                            "stride": list(x.stride()), "offset": 0}
                continue
            dt = getattr(torch, dtypes.get(sid, "uint8"))
            v = first.get(sid)
            if v is not None and not v["offset"] and _span(v["shape"], v["stride"]) * dt.itemsize == st["nbytes"]:
                # The buffer allocated in the layout of its first view, which is then the buffer itself: a kernel
                # that writes a view of a buffer is traced as a copy back into it, one that writes the buffer is not.
                bases.append(torch.empty_strided(v["shape"], v["stride"], dtype=dt, device=device))
                own[sid] = v
            else:
                bases.append(torch.empty(st["nbytes"] // dt.itemsize, dtype=dt, device=device))

        def view(v: dict[str, Any]) -> torch.Tensor:
            base = bases[v["storage"]]
            return base if own.get(v["storage"]) == v else base.as_strided(v["shape"], v["stride"], v["offset"])

        wrapped: dict[str, Any] = {}

        def launch(name: str, grid: tuple[int, ...], kwargs: dict[str, Any]) -> None:
            if name not in wrapped:
                wrapped[name] = wrap_triton(getattr(self.kernels, name))
            wrapped[name][grid](**kwargs)

        run_steps(self.plan, view, launch, device)
        outs, taken = [], set()
        for o in self.plan.outputs:
            t = view(o)
            # An op's outputs alias neither its inputs nor each other.
            if self.plan.storages[o["storage"]]["kind"] == "input" or o["storage"] in taken:
                t = t.clone()
            taken.add(o["storage"])
            outs.append(t)
        return outs[0] if len(outs) == 1 else tuple(outs)


def _overlaps(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether two elements of a view with this layout may share memory (dimensions taken from the smallest stride
    up, each must step past all the smaller ones reach; a layout that interleaves them is counted as sharing)."""
    if 0 in shape:
        return False
    reach = 0  # the largest offset the dimensions taken so far reach
    for d, n in sorted((d, n) for n, d in zip(shape, stride) if n > 1):
        if d <= reach:
            return True
        reach += (n - 1) * d
    return False


def _span(shape: Sequence[int], stride: Sequence[int]) -> int:
    """The elements a view's layout reaches from its start."""
    return 0 if 0 in shape else 1 + sum((n - 1) * d for n, d in zip(shape, stride))


def _plan_views(plan: Any) -> Iterator[dict[str, Any] | None]:
    """Every view the plan makes of its storages (None for a tensor descriptor's)."""

    def arg_views(a: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
        (kind, val), = a.items()
        if kind == "t":
            yield val
        elif kind == "tuple":
            for x in val:
                yield from arg_views(x)
        elif kind == "desc":
            yield None

    for step in plan.steps:
        if step["op"] == "launch":
            for a in step["args"].values():
                yield from arg_views(a)
        else:
            yield from (step[k] for k in ("dst", "src") if k in step)
    yield from plan.outputs


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
        log.warning("kernelsmith: kernel %s: its judged plan cannot run here (%s)",
                    record.sha256[:12], e)
        return None, f"its judged plan cannot run here: {e}"
