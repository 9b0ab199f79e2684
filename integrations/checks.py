"""A pack kernel as it serves, and the checks that prove it on the device a layer runs on before its first result is
used: the pack's golden vectors, or, for a problem too large to carry them, the stack's own computation at the
kernel's signature (and at the other signatures along an op's free dims, :mod:`integrations.served_op`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .serving import R_NO_VECTORS
from .signature import Signature, random_inputs, spec_signature

if TYPE_CHECKING:
    from kernel_cache.record import KernelRecord
    from ks_core.problem_record import Problem


@dataclass
class PackKernel:
    """One pack kernel as it serves: loaded on first use, after its golden vectors pass on the call's device."""

    record: KernelRecord
    problem: Problem
    vectors: bytes | None
    state: str = "unchecked"  # unchecked | passed | failed | none | slower | broken
    note: str = ""
    loaded: Any = None  # kernel_ops.LoadedKernel: its module, loaded only where a call needs its forward
    # At its problem's signature it runs the launch plan its verdict was reached with (``ks_inductor.judged_plan``),
    # where its record carries one that runs here; ``judged_note`` says why not, once it was tried.
    judged: Any = None
    judged_note: str = ""
    race_us: tuple[float, float] | None = None  # median µs per call: (ours, the stack's own), where it was raced
    # Its launches replayed without its Python forward (``launch_plan``), made once it passed its check on a GPU;
    # None where it has none (``plan_note`` says why).
    plan: Any = None
    plan_note: str = ""
    # Signatures other than its problem's, along the op's free dims (``PackGuard.bind``), where it was proven
    # against the stack's own computation once: what a call there runs.
    at: dict[Signature, SignatureProof] = field(default_factory=dict)
    # Whether it beat the stack's own path, by bucket (its free dims' sizes as powers of two, its inputs' layouts):
    # "" where it did, else why not. Its problem's own signature fills the bucket it falls in.
    bucket_races: dict[tuple[Any, ...], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, *args: Any) -> Any:
        """The kernel's outputs for ``args`` at its problem's signature: through its launch plan where it has one,
        else as judged."""
        return launch(self.plan, self.judged_call, args)

    def judged_call(self, *args: Any) -> Any:
        """The kernel's outputs at its problem's signature as the judge ran it: its judged plan, or None where the
        plan declines the call (an input that starts past its storage's first byte: the stack computes it)."""
        if self.judged is None:
            raise RuntimeError(load_kernel(self) or "its judged plan is not loaded")
        return self.judged(*args)


@dataclass
class SignatureProof:
    """A pack kernel at a signature its problem does not have (another length along a free dim): whether it
    computed what the stack computes there (``why`` empty), the outputs it must return, and how it launches: the
    plan recorded there and proven (``runs``, ``plan_at``), replayed through a static launcher where one was made
    (``plan``)."""

    kernel: PackKernel
    why: str
    outputs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    plan: Any = None
    runs: Any = None

    def call(self, *args: Any) -> Any:
        return launch(self.plan, self.runs, args)


def plan_at(kernel: PackKernel, sig: Signature, device: torch.device) -> tuple[Any, str]:
    """The kernel at ``sig``, a signature it is proven at rather than judged at: its launches recorded from one call
    of its forward on random inputs there, run as the judge runs a plan (``JudgedPlan.of``: its Triton kernels built
    from its source alone, allocations made fresh each call). What the stack then proves there is what serves
    there, and the forward never runs again: one that is right while it is proven and wrong later has nothing to
    act on. (plan, "") or (None, why not)."""
    from ks_inductor.judge import plan as PL
    from ks_inductor.judge.kernel_source import KernelSourceError, kernels_module
    from ks_inductor.judged_plan import JudgedPlan, JudgedPlanError
    from ks_inductor.source_module import load_source_module

    why = load_kernel(kernel, forward=True)
    if why:
        return None, why
    loaded = kernel.loaded
    try:
        # As the judge records: the kernels recorded, not launched (the plan compiles and runs them), except
        # behind an autotuner, which runs once for real first.
        tuned = PL.autotuned(loaded.module)
        if tuned:
            with torch.no_grad():
                loaded.model(*random_inputs(sig, device))
        plan, payload, computed = PL.record(loaded.model, random_inputs(sig, device), [],
                                            PL.kernel_lookup(loaded.module), launch=tuned)
    except PL.PlanError as e:
        return None, f"no launch plan here: {e}"
    except Exception as e:  # noqa: BLE001 - a forward that raises here is not served here
        return None, f"its forward raised here: {type(e).__name__}: {e}"
    if computed:
        return None, f"its forward computes with torch ops here ({', '.join(sorted(computed)[:4])})"
    try:
        kernels = (kernel.judged.kernels if kernel.judged is not None
                   else load_source_module(kernels_module(kernel.record.source), "ks_judged"))
        return JudgedPlan.of(plan, payload, kernels, sig), ""
    except (JudgedPlanError, KernelSourceError) as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a kernels module that does not import is a plan that cannot run
        return None, f"its kernels do not import: {type(e).__name__}: {e}"


def launch(plan: Any, forward: Callable[..., Any], args: tuple) -> Any:
    """A kernel's outputs: replayed from its launch plan, or from ``forward`` (its judged plan, or one recorded and
    proven at the call's signature) where it has none or the plan declines this call (a pointer no longer aligned
    as it was specialized). None where that declines too: the caller computes it its own way."""
    if plan is not None:
        out = plan(*args)
        if out is not None:
            return out
    return forward(*args)


def kernel_rank(ke: dict[str, Any]) -> float:
    """A pack manifest entry's recorded speedup, for ranking a key's kernels (0 where it has none)."""
    sp = ke.get("speedup")
    return float(sp) if isinstance(sp, (int, float)) else 0.0


def _tolerance(dtype: str) -> tuple[float, float]:
    from ks_inductor.judge.config import JudgeConfig

    return JudgeConfig().tolerance(dtype)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def load_kernel(kernel: PackKernel, forward: bool = False) -> str:
    """Make the kernel ready to run at its problem's signature, once: its judged plan, where its record carries one
    that runs here (else it cannot serve); with ``forward``, its module, forward included, for recording its launches
    at another signature (``plan_at``). Why it cannot be, else ""."""
    from ks_inductor.compiler import kernel_ops as ko

    if not forward:
        if kernel.judged is None and not kernel.judged_note:
            from ks_inductor.judged_plan import judged_plan

            kernel.judged, kernel.judged_note = judged_plan(kernel.record, kernel.problem)
        if kernel.judged is not None:
            return ""
        # What the judge ran is the plan; a forward is the candidate's own Python, whose word counts for nothing
        # (a forward honest only while it is judged is the exploit). So a kernel without a plan that runs here is
        # never served at its problem's signature.
        return f"{kernel.judged_note}: only a judged plan serves (export the pack again from a cache that holds it)"
    if kernel.loaded is None:
        try:
            kernel.loaded = ko.load_kernel(kernel.record)
        except ko.KernelLoadError as e:
            return f"cannot load: {e}"
    return ""


def check_trials(kernel: PackKernel, trials: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
                 run: Callable[..., Any] | None = None) -> str:
    """Why the kernel's outputs (``run``, by default as judged at its problem's signature) differ from the
    reference's on ``trials``, else ""."""
    from ks_inductor.judge.compare import compare_outputs

    run = run if run is not None else kernel.judged_call
    for i, (ins, ref) in enumerate(trials):
        try:
            with torch.no_grad():
                got = [o.detach().to("cpu") for o in _as_list(run(*ins)) if isinstance(o, torch.Tensor)]
        except Exception as e:  # noqa: BLE001 - a kernel that raises on its own check is not served
            return f"trial {i}: {type(e).__name__}: {e}"
        _, why = compare_outputs([r.to("cpu") for r in ref], got, _tolerance, i, "golden")
        if why:
            return why
    return ""


def run_golden_vectors(kernel: PackKernel, device: torch.device) -> tuple[bool, str]:
    """Run the kernel on its golden inputs on ``device`` and compare with the reference outputs the pack carries."""
    from kernel_cache.pack import golden_inputs

    if kernel.vectors is None:
        return False, R_NO_VECTORS
    _, vectors, _ = golden_inputs(kernel.vectors)
    if not vectors:
        return False, R_NO_VECTORS
    why = load_kernel(kernel)
    if why:
        return False, why
    # Each input laid out at the problem's signature, starting its own storage: the vectors come out of one file
    # buffer, and what is checked must be what serves (the judged plan, which takes exactly that layout).
    sig = spec_signature(kernel.problem.input_specs)
    trials = [([_placed(x, sig[i] if sig is not None and len(sig) == len(ins) else None, device)
                for i, x in enumerate(ins)], outs) for ins, outs in vectors]
    why = check_trials(kernel, trials)
    return not why, why


def _placed(x: torch.Tensor, at: tuple[Any, Any, Any] | None, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` in a storage of its own, with the signature's strides where it has its shape."""
    if at is None or list(at[0]) != list(x.shape) or at[1] != x.dtype:
        return x.to(device).clone()
    return torch.empty_strided(at[0], at[2], dtype=x.dtype, device=device).copy_(x)


def run_against_stack(kernel: PackKernel, device: torch.device, reference: Callable[..., Any],
                      n: int = 2) -> tuple[bool, str]:
    """For a kernel whose problem was too large for golden vectors: seeded random inputs at its signature, on
    ``device``, compared with the stack's own computation of the op (the layer's code, not the pack's)."""
    sig = spec_signature(kernel.problem.input_specs)
    if sig is None:
        return False, R_NO_VECTORS
    why = load_kernel(kernel)
    if why:
        return False, why
    trials = stack_trials(device, reference, sig, n)
    if isinstance(trials, str):
        return False, trials
    why = check_trials(kernel, trials)
    return not why, why


def stack_trials(device: torch.device, reference: Callable[..., Any], sig: Signature,
                 n: int = 2) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]] | str:
    """``n`` sets of seeded random inputs at ``sig`` with the stack's own outputs for them; why not, where the
    stack's computation raises there."""
    gen = torch.Generator(device=device).manual_seed(0)
    trials = []
    for _ in range(n):
        ins = random_inputs(sig, device, gen)
        try:
            with torch.no_grad():
                ref = [o for o in _as_list(reference(*[x.clone() for x in ins])) if isinstance(o, torch.Tensor)]
        except Exception as e:  # noqa: BLE001 - a signature the stack itself cannot compute is never served
            return f"the stack's own computation raised: {type(e).__name__}: {e}"
        trials.append((ins, ref))
    return trials
