"""The graph-level never-slower rule: a compiled graph with swapped kernels is kept only if it beats Inductor.

Each swapped kernel was verified faster than Inductor on its region alone, but a graph is more than its regions:
a region Inductor would have fused with its neighbours, a kernel call's host overhead in a launch-bound decode
step, or a layout copy at a region's edge can make the whole graph slower (the H200 decode layer was 5-9% slower
with one faster region). So after compiling the graph with its swaps, the backend also compiles it with Inductor
alone, runs both on the example inputs, and keeps the swaps only when the lower confidence bound of the speedup
is above 1.

What is timed is a batch of back-to-back calls without cache flushes, the way a model runs: the host's launch
overhead and the overlap between calls count. Rounds of the two graphs are interleaved and shuffled; the bound
comes from the judge's paired bootstrap (:func:`ks_inductor.judge.timing.ratio_with_lcb`).

Where the graph with every swap loses, the backend tries the kernels without the regions it serves by eager's ops
(``backend.swap_sets``) before Inductor alone: an eager region is an opaque op that runs the region's graph in
Python on each call, a host cost that a launch-bound graph pays in full (an H100 decode layer: 0.554 ms with two
such regions beside the kernels, against Inductor's 0.445; docs/findings.md, "The decoder layer").

Running the user's graph at compile time must not change the user's state, so a graph that mutates anything
(in-place ops, ``setitem``, mutable custom ops) is not timed and keeps its per-region decision; the RNG state is
restored after the runs.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from ks_inductor.contracts import CompileStore
from ks_inductor.judge import device_lock

log = logging.getLogger(__name__)

_INPLACE_OPERATORS = frozenset({
    operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.imatmul,
})


CONFIRMATIONS = 2  # agreeing measurements, in separate processes, before a stored decision is reused


@dataclass
class GuardConfig:
    rounds: int = 7
    round_ms: float = 15.0  # wall time of one batch of calls
    max_calls: int = 200  # calls per round at most
    warmup_calls: int = 3
    q: float = 0.05  # the bound is this quantile of the bootstrap
    budget_s: float = 10.0  # a graph whose calls are so slow that the protocol would exceed this is not timed


@dataclass
class GuardResult:
    kept: bool  # keep the graph with swaps
    swapped_ms: float | None = None
    inductor_ms: float | None = None
    speedup: float | None = None  # inductor / swapped, medians
    lcb: float | None = None
    samples: int = 0  # batch samples taken, both graphs
    seconds: float = 0.0
    note: str = ""
    # Measurements behind the decision, each taken in its own process, that agreed on ``kept``. A stored decision
    # is reused only from CONFIRMATIONS on: one measurement can be far off (a host whose cores another job held
    # made Inductor's CPU graph 2000 times slower in CI), and a wrong one would otherwise stand for good.
    measurements: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mutation_in(gm: fx.GraphModule) -> str | None:
    """The first node that mutates a value (so running the graph changes the caller's state), or None."""
    for node in gm.graph.nodes:
        if node.op == "call_method" and _inplace_name(str(node.target)):
            return f"{node.name} ({node.target})"
        if node.op != "call_function":
            continue
        t = node.target
        if t in _INPLACE_OPERATORS:
            return f"{node.name} ({getattr(t, '__name__', t)})"
        schema = getattr(t, "_schema", None)
        if schema is not None and getattr(schema, "is_mutable", False):
            return f"{node.name} ({t})"
        name = getattr(t, "__name__", "")
        if _inplace_name(name):
            return f"{node.name} ({name})"
    return None


def _inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and not name.endswith("__")


def _device_of(inputs: Sequence[Any]) -> str:
    for v in inputs:
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return "cuda"
    return "cpu"


def _cuda_index(inputs: Sequence[Any]) -> int | None:
    """The CUDA device the inputs are on (None: the current one)."""
    for v in inputs:
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return v.device.index
    return None


def _batch_ms(fn: Callable[[], Any], n: int, device: str) -> float:
    """Milliseconds per call over ``n`` back-to-back calls."""
    if device == "cpu":
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3 / n
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def interleaved_batches(fns: dict[str, Callable[[], Any]], device: str, cfg: GuardConfig | None = None,
                        seed: int = 0) -> dict[str, list[list[float]]]:
    """Per function, per round, four samples of ms per call over back-to-back batches; rounds are interleaved
    and shuffled so drift in clocks or host load hits every function alike. Raises what a function raises."""
    cfg = cfg or GuardConfig()
    for fn in fns.values():
        for _ in range(cfg.warmup_calls):
            fn()
    est = {name: _batch_ms(fn, 2, device) for name, fn in fns.items()}
    if cfg.rounds * 4 * sum(est.values()) > cfg.budget_s * 1e3:
        raise TimeoutError(f"calls take {max(est.values()):.1f} ms: over the timing budget of {cfg.budget_s} s")
    per = {n: max(1, int(min(cfg.max_calls, max(4, cfg.round_ms / max(e, 1e-4)))) // 4) for n, e in est.items()}
    samples: dict[str, list[list[float]]] = {n: [] for n in fns}
    rng = random.Random(seed)
    names = list(fns)
    for _ in range(cfg.rounds):
        rng.shuffle(names)
        for name in names:
            samples[name].append([_batch_ms(fns[name], per[name], device) for _ in range(4)])
    return samples


def compare(swapped: Callable[..., Any], inductor: Callable[..., Any], inputs: Sequence[Any],
            cfg: GuardConfig | None = None, seed: int = 0) -> GuardResult:
    """Time both compiled graphs on ``inputs`` and decide. Failures of the swapped graph decide against it."""
    from ks_inductor.judge.timing import ratio_with_lcb

    cfg = cfg or GuardConfig()
    device = _device_of(inputs)
    args = list(inputs)
    t_start = time.perf_counter()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device == "cuda" else None
    fns = {"swapped": lambda: swapped(*args), "inductor": lambda: inductor(*args)}
    # The device alone against every kernelsmith process (a judge's jobs, another compile's guard), warm-up
    # included: a first call may autotune, and anything else on the device would be timed with the graphs. CPU
    # graphs share the host's cores with everything, which no lock of kernelsmith's can keep apart.
    alone = device_lock.exclusive(_cuda_index(args)) if device == "cuda" else contextlib.nullcontext()
    try:
        with alone, torch.no_grad():
            samples = interleaved_batches(fns, device, cfg, seed)
    except TimeoutError as e:
        return GuardResult(kept=True, note=f"not timed: {e}", seconds=time.perf_counter() - t_start)
    except Exception as e:  # noqa: BLE001 - the swapped graph faulted at run time: Inductor then
        return GuardResult(kept=False, note=f"swapped graph failed when timed: {type(e).__name__}: {e}"[:300],
                           seconds=time.perf_counter() - t_start)
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    ratio, lcb = ratio_with_lcb(samples["inductor"], samples["swapped"], q=cfg.q)
    med = {n: statistics.median(x for r in s for x in r) for n, s in samples.items()}
    kept = lcb > 1.0
    note = (f"graph with swaps {med['swapped']:.4f} ms vs Inductor {med['inductor']:.4f} ms "
            f"(x{ratio:.3f}, bound {lcb:.3f}): " + ("kept" if kept else "Inductor alone is used"))
    return GuardResult(kept=kept, swapped_ms=med["swapped"], inductor_ms=med["inductor"], speedup=ratio, lcb=lcb,
                       samples=sum(len(s) * 4 for s in samples.values()),
                       seconds=time.perf_counter() - t_start, note=note)


# ------------------------------------------------------------------------------------------ the plan of a compile
# What the backend asks before and after compiling a graph with its swaps: was this exact decision measured before
# (this process, or through the kernel database an earlier one), and if not, measure it and keep the result.

# In-process memo of graph guard results by key; the store keeps them across processes.
_GUARD_MEMO: dict[str, GuardResult] = {}
# Bump when what the guard measures or how it decides changes: older stored decisions are then not reused.
GUARD_KEY_VERSION = "ks-guard-v1"


def guard_key(gm: fx.GraphModule, example_inputs: list[Any], kernels: list[Any], patches: dict[str, Any],
              fingerprint_id: str = "", variant: str = "") -> str:
    """What a guard decision depends on: the graph, its inputs' shapes, the kernels swapped in (their records, by
    content), the op variant, this machine (the fingerprint: device, torch, Triton, driver), Inductor's options
    (the patches and the global config) and the guard's protocol. A patch value without a stable repr (a
    callable) makes a key that no other process computes, so such decisions are never reused across processes."""
    import hashlib

    from ks_inductor.compiler.regions import value_text

    parts = [GUARD_KEY_VERSION, torch.__version__, fingerprint_id, variant, gm.code,
             repr(sorted((k, repr(v)) for k, v in patches.items())), _inductor_config_hash(),
             repr(asdict(GuardConfig()))]
    for v in example_inputs:
        # symbolic sizes with their hints: the swapped kernels were specialised to them
        parts.append(value_text(v)[0] + (str(v.device) if isinstance(v, torch.Tensor) else ""))
    parts += [f"{k.id}:{k.problem_key}:{k.sha256}" for k in kernels]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _inductor_config_hash() -> str:
    get_hash = getattr(torch._inductor.config, "get_hash", None)
    if get_hash is None:
        return "?"
    h = get_hash()
    return h.hex() if isinstance(h, bytes) else str(h)


@dataclass
class GuardPlan:
    key: str | None  # None: the graph is not timed, ``known`` says why
    fingerprint_id: str
    store: CompileStore | None
    known: GuardResult | None = None  # measured before (this process or, through the store, an earlier one)
    unconfirmed: GuardResult | None = None  # a stored result that this process measures again before reusing it

    @classmethod
    def make(cls, gm: fx.GraphModule, example_inputs: list[Any], kernels: list[Any] | None,
             patches: dict[str, Any], fingerprint: Callable[[], Any], variant: str, store: CompileStore | None) -> GuardPlan | None:
        """The guard's plan for this compile, or None where it does not run (``kernels`` None: the options or
        untimed kernels turn it off) or cannot (then the swaps stand). ``kernels``: the records swapped in;
        ``fingerprint``: this machine's, computed only when the graph is timed."""
        if kernels is None:
            return None
        try:
            mutated = mutation_in(gm)
            if mutated is not None:
                return cls(None, "", store, GuardResult(kept=True, note=f"not timed: the graph mutates a value at "
                                                                        f"{mutated}"))
            fp_id = fingerprint().id
            plan = cls(guard_key(gm, example_inputs, kernels, patches, fp_id, variant), fp_id, store)
        except Exception as e:  # noqa: BLE001 - the guard itself failed: the per-region decision stands
            log.warning("kernelsmith: graph guard failed (%s: %s); keeping the swaps", type(e).__name__, e)
            return None
        plan.known = plan._recall()
        return plan

    def _recall(self) -> GuardResult | None:
        if self.key is None:
            return self.known
        result = _GUARD_MEMO.get(self.key)
        if result is not None or self.store is None:
            return result
        try:
            data = self.store.guard_decision(self.key)
            if data is None:
                return None
            fields = GuardResult.__dataclass_fields__
            result = GuardResult(**{k: v for k, v in data.items() if k in fields})
            result.measurements = int(result.measurements)
        except Exception as e:  # noqa: BLE001 - an unreadable decision is measured again
            log.debug("graph guard decision %s unreadable: %s", self.key[:12], e)
            return None
        if result.measurements < CONFIRMATIONS:
            self.unconfirmed = result
            return None
        _GUARD_MEMO[self.key] = result
        return result

    def remember(self, result: GuardResult) -> GuardResult:
        """Keep ``result`` for this process and the store; returns it, counting the stored measurement it
        confirms."""
        if self.key is None:
            return result
        prior = self.unconfirmed
        if prior is not None:
            if prior.kept == result.kept:
                result = replace(result, measurements=prior.measurements + 1)
            else:
                log.info("kernelsmith: graph guard measured %s after a stored %s (%s); it measures again in the "
                         "next process", "keep" if result.kept else "drop", "keep" if prior.kept else "drop",
                         prior.note)
        _GUARD_MEMO[self.key] = result
        # A measurement holds for the next process too; a run that failed might not fail again, so it is not kept.
        if self.store is None or (result.speedup is None and not result.kept):
            return result
        try:
            self.store.put_guard_decision(self.key, self.fingerprint_id, result.to_json())
        except Exception as e:  # noqa: BLE001 - read-only or busy database: the next process measures again
            log.debug("could not store graph guard decision %s: %s", self.key[:12], e)
        return result

    @property
    def measures(self) -> bool:
        """Whether :meth:`decide` will time the graphs (no decision is known for this compile)."""
        return self.known is None and self.key is not None

    def decide(self, new_gm: fx.GraphModule, example_inputs: list[Any], compiled: Any, patches: dict[str, Any],
               inductor: Callable[[], Any]) -> GuardResult:
        """Whether the graph with swaps (``new_gm``, compiled as ``compiled``) beats Inductor alone: the known
        decision, or one measured now against ``inductor()``, Inductor's own compile of the graph without CUDA
        graphs (the backend's ``InductorAlone.for_timing``)."""
        from torch._inductor.compile_fx import compile_fx

        result = self.known
        if result is None and self.key is not None:
            # CUDA-graph callables must not be run inside the backend (they would record here): time variants
            # compiled without CUDA graphs; the backend hands back the ones compiled with the user's options.
            cudagraphs = patches.get("triton.cudagraphs", torch._inductor.config.triton.cudagraphs)
            plain_t = inductor()
            swapped_t = compiled if not cudagraphs else compile_fx(new_gm, example_inputs,
                                                                   config_patches={**patches,
                                                                                   "triton.cudagraphs": False})
            result = self.remember(compare(swapped_t, plain_t, example_inputs))
        assert result is not None
        return result
