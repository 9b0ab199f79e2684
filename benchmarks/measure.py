"""Measuring one problem against its tools: correctness first, then the judge's timing protocol, same process.

For each problem: build the reference ``Model`` on the device, draw ``rotating_sets`` input sets from the
problem's own ``get_inputs()``, and take the reference model's output in its own dtype as the yardstick. Every
tool is built, run once on the first input set and compared with that reference at the problem dtype's
tolerance (the judge's tolerances and comparison); a tool that raises or disagrees is reported as failed with its
error and is not timed. The tools that pass are timed together by ``benchmark_interleaved``: per call the inputs
are refreshed in place from the next set, L2 is flushed, and a CUDA event pair brackets the call alone; rounds
are interleaved in shuffled order. kernelsmith's speedup over each peer comes with the lower confidence bound of
the judge's paired bootstrap over rounds.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

from benchmarks.peers import PeerUnavailable
from benchmarks.results import (
    FAILED,
    KERNELSMITH,
    NO_KERNEL,
    OK,
    UNAVAILABLE,
    Speedup,
    ToolResult,
    WorkloadResult,
)
from benchmarks.roofline import Ceilings, floor_ms
from ks_inductor.judge.timing import FINAL

log = logging.getLogger(__name__)


# The benchmarks time peers with the judge's final protocol, the one every stored kernel passed: its defaults are
# the judge's (ks_inductor.judge.timing.FINAL), not restated here.
@dataclass
class Protocol:
    rounds: int = FINAL.rounds
    warmup_ms: float = FINAL.warmup_ms
    rep_ms: float = FINAL.rep_ms
    min_reps: int = FINAL.min_reps
    max_reps: int = FINAL.max_reps
    rotating_sets: int = FINAL.rotating_sets
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["timer"] = ("ks_inductor.judge.timing.benchmark_interleaved: per call refresh inputs in place from the "
                      "next of rotating_sets sets, flush L2 (max(2 x L2, 256 MiB) zeroed), an untimed GPU spin "
                      "(~100 us) so the host stays ahead, CUDA event pair around the call; rounds interleaved in "
                      "shuffled order; median and IQR over all samples; speedup LCB = 5% paired bootstrap over rounds")
        return d

    @classmethod
    def smoke(cls) -> Protocol:
        return cls(rounds=2, warmup_ms=0.0, rep_ms=0.0, min_reps=2, max_reps=2, rotating_sets=2)


def as_outputs(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    raise TypeError(f"expected a tensor or a tuple of tensors, got {type(out).__name__}")


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def make_input_sets(mod: Any, n: int, device: str, seed: int) -> list[list[Any]]:
    import torch

    sets = []
    for k in range(max(n, 1)):
        torch.manual_seed(seed + 7919 * k)
        sets.append([x.to(device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()])
    return sets


def check_outputs(ref: list[Any], outs: list[Any], expect_dtypes: list[Any], tolerance: tuple[float, float]
                  ) -> tuple[float | None, str | None]:
    """(max abs error, reason it fails or None). Compared in fp32 against ``ref`` (already upcast)."""
    import torch

    from ks_inductor.judge.compare import compare_outputs

    if len(outs) != len(expect_dtypes):
        return None, f"returned {len(outs)} outputs, the reference {len(expect_dtypes)}"
    for i, (o, dt) in enumerate(zip(outs, expect_dtypes)):
        if o.dtype != dt:
            return None, f"output {i} has dtype {o.dtype}, expected {dt}"
    up = [o.detach().float() if o.is_floating_point() else o.detach() for o in outs]
    up = [u.to(r.device) for u, r in zip(up, ref)]
    mismatch, why = compare_outputs(ref, up, lambda _dtype: tolerance, 0, "native")
    err = None
    if mismatch is not None:
        err = mismatch.max_abs_error
    elif ref:
        err = max(float((u.to(torch.float64) - r.to(torch.float64)).abs().max()) if r.numel() else 0.0
                  for u, r in zip(up, ref))
    return err, why


def _timing(rounds: list[list[float]], note: str = "") -> ToolResult:
    from ks_inductor.judge.timing import summarize

    t = summarize(rounds)
    return ToolResult(status=OK, median_ms=t.median_ms, iqr_ms=t.iqr_ms, min_ms=t.min_ms, n=t.n,
                      round_medians_ms=[statistics.median(r) for r in rounds if r], note=note)


def measure_tools(tools: dict[str, Callable[[], Callable[[], Any]]], ref: list[Any], expect_dtypes: list[Any],
                  rotate: Callable[[int], None], tolerance: tuple[float, float], device: str, protocol: Protocol,
                  notes: dict[str, str] | None = None, ref32: list[Any] | None = None
                  ) -> tuple[dict[str, ToolResult], dict[str, list[list[float]]]]:
    """Check then time ``tools`` (name -> factory of the zero-argument callable). A tool passes against the
    problem's own reference or, where that is low precision, against the same model run in fp32."""
    import torch

    from ks_inductor.judge.timing import benchmark_interleaved, make_l2_flush

    notes = notes or {}
    results: dict[str, ToolResult] = {}
    fns: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        for name, factory in tools.items():
            try:
                fn = factory()
                rotate(0)
                outs = as_outputs(fn())
                _sync(device)
                err, why = check_outputs(ref, outs, expect_dtypes, tolerance)
                if why and ref32 is not None:
                    # A fused kernel that rounds once in fp32 can miss the bf16 reference on a cancelling
                    # element (RoPE) while being closer to the exact result: it passes against the fp32 model.
                    err32, why32 = check_outputs(ref32, outs, expect_dtypes, tolerance)
                    if why32 is None:
                        err, why = err32, None
                        notes = {**notes, name: (notes.get(name, "") + " checked against the fp32 model").strip()}
            except PeerUnavailable as e:
                results[name] = ToolResult(status=UNAVAILABLE, error=str(e), note=notes.get(name, ""))
                continue
            except Exception as e:  # noqa: BLE001 - a tool that crashes is a reported failure, not a crash
                log.warning("%s failed to run: %s", name, e)
                results[name] = ToolResult(status=FAILED, error=f"{type(e).__name__}: {e}"[:500],
                                           note=notes.get(name, ""))
                continue
            if why:
                results[name] = ToolResult(status=FAILED, error=f"wrong output: {why}", max_abs_error=err,
                                           note=notes.get(name, ""))
                continue
            results[name] = ToolResult(status=OK, max_abs_error=err, note=notes.get(name, ""))
            fns[name] = fn
        samples: dict[str, list[list[float]]] = {}
        for _attempt in range(2):
            if not fns:
                break
            try:
                samples = benchmark_interleaved(
                    fns, rounds=protocol.rounds, warmup_ms=protocol.warmup_ms, rep_ms=protocol.rep_ms,
                    min_reps=protocol.min_reps, max_reps=protocol.max_reps, before_each=rotate,
                    seed=protocol.seed, device=device, flush=make_l2_flush(device))
                break
            except Exception as e:  # noqa: BLE001 - find the tool that broke, report it, time the rest
                log.warning("timing failed (%s); isolating the failing tool", e)
                for name in list(fns):
                    try:
                        rotate(0)
                        fns[name]()
                        _sync(device)
                    except Exception as e2:  # noqa: BLE001
                        results[name] = ToolResult(status=FAILED, error=f"failed while timed: {type(e2).__name__}: "
                                                                        f"{e2}"[:500], note=notes.get(name, ""))
                        del fns[name]
                samples = {}
    for name, rounds in samples.items():
        r = _timing(rounds, notes.get(name, ""))
        r.max_abs_error = results[name].max_abs_error
        results[name] = r
    for name in fns:
        if name not in samples:
            results[name] = ToolResult(status=FAILED, error="timing failed for every tool together",
                                       note=notes.get(name, ""))
    return results, samples


def speedups_of(samples: dict[str, list[list[float]]], target: str = KERNELSMITH) -> dict[str, Speedup]:
    from ks_inductor.judge.timing import ratio_with_lcb

    if target not in samples:
        return {}
    out = {}
    for name, rounds in samples.items():
        if name == target:
            continue
        ratio, lcb = ratio_with_lcb(rounds, samples[target])
        out[name] = Speedup(ratio=ratio, lcb=lcb)
    return out


@dataclass
class ProblemSetup:
    """A problem made runnable: the module, the reference model, input sets and the in-place rotation."""

    mod: Any
    model: Any
    sets: list[list[Any]]
    active: list[Any]
    ref: list[Any]
    expect_dtypes: list[Any]
    ref32: list[Any] | None = None  # the model run in fp32 on upcast inputs (low-precision problems only)

    def rotate(self, i: int) -> None:
        import torch

        for a, s in zip(self.active, self.sets[i % len(self.sets)]):
            if isinstance(a, torch.Tensor):
                a.copy_(s)


def setup_problem(source: str, device: str, protocol: Protocol, filename: str = "<problem>") -> ProblemSetup:
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge.inputs import build_model

    mod = exec_problem_source(source, filename)
    model = build_model(mod, "Model", protocol.seed, device)
    sets = make_input_sets(mod, protocol.rotating_sets, device, protocol.seed + 1)
    active = [x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]]
    with torch.no_grad():
        eager_out = as_outputs(model(*active))
    expect = [o.dtype for o in eager_out]
    # The yardstick is the problem's own reference in its own dtype, exactly what the judge holds candidates to:
    # an fp32 upcast reference fails even eager bf16 RoPE (one element in 16.8M, from cancellation).
    ref = [o.detach().float() if o.is_floating_point() else o.detach() for o in eager_out]
    del eager_out
    ref32 = None
    if any(t in (torch.bfloat16, torch.float16) for t in expect):
        import copy

        model32 = copy.deepcopy(model).float()
        up = [x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in active]
        with torch.no_grad():
            ref32 = [o.detach().float() if o.is_floating_point() else o.detach() for o in as_outputs(model32(*up))]
        del model32, up
    return ProblemSetup(mod, model, sets, active, ref, expect, ref32)


def measure_problem(problem: Problem, setup: ProblemSetup, *, name: str, op: str, dtype: str, phase: str, shape: str,
                    peer_builders: dict[str, Any], lookup: Any, device: str, protocol: Protocol,
                    ceilings: Ceilings, tolerance: tuple[float, float], notes: dict[str, str] | None = None,
                    kernel_rejected: str | None = None) -> WorkloadResult:
    """One row of a suite: the problem timed under every peer and under kernelsmith's cached kernel.

    ``lookup`` is a :class:`benchmarks.kernelsmith_peer.KernelLookup` (None: kernelsmith not asked);
    ``kernel_rejected`` is the judge's reason when a suite re-judged the cached kernel and it failed.
    """
    from benchmarks.kernelsmith_peer import build_kernel_model

    fl, bound = floor_ms(problem.bytes_moved, problem.flops, problem.op_summary, dtype, ceilings)
    row = WorkloadResult(name=name, op=op, dtype=dtype, phase=phase, shape=shape, problem_key=problem.key,
                         bytes_moved=problem.bytes_moved, flops=problem.flops, floor_ms=fl, floor_bound=bound)
    factories: dict[str, Callable[[], Callable[[], Any]]] = {}
    for peer, builder in peer_builders.items():
        factories[peer] = (lambda b=builder: b(setup.model, setup.active))
    rec = lookup.record if lookup is not None else None
    if rec is not None:
        row.kernel = lookup.provenance()
    elif lookup is not None and lookup.evolved:
        row.kernel = {"evolved_here": lookup.evolved}
    if rec is not None and kernel_rejected is None:
        def ks_factory() -> Callable[[], Any]:
            km = build_kernel_model(rec.source, list(setup.mod.get_init_inputs()), setup.model, device)
            return lambda: km(*setup.active)

        factories[KERNELSMITH] = ks_factory
    tools, samples = measure_tools(factories, setup.ref, setup.expect_dtypes, setup.rotate, tolerance, device,
                                   protocol, notes, ref32=setup.ref32)
    if kernel_rejected is not None:
        tools[KERNELSMITH] = ToolResult(status=FAILED, error=f"the judge rejected the cached kernel: "
                                                             f"{kernel_rejected}"[:500])
    elif KERNELSMITH not in tools and lookup is not None:  # no lookup: kernelsmith left out on purpose
        tools[KERNELSMITH] = ToolResult(status=NO_KERNEL, error=lookup.reason)
    row.tools = tools
    row.speedups = speedups_of(samples)
    return row
