"""The ``kernelsmith`` torch.compile backend.

``torch.compile(model, backend="kernelsmith")`` finds :func:`kernelsmith_backend` through the
``torch_dynamo_backends`` entry point (setup.py); this module registers nothing itself, because a second
registration of the name makes Dynamo's lookup fail (research note C §1.3).

What happens to a graph:

1. :func:`ks_inductor.compiler.regions.partition` cuts the Dynamo graph into regions, each a Problem with the canonical
   key the optimizer and the cache use.
2. Each region is looked up in the kernel cache for this machine's fingerprint. A hit is a verified kernel whose
   recorded speedup over Inductor is at least ``min_speedup`` (interpreter kernels are untimed and serve only the
   interpreter). A region without one is served by eager's ops where its stored room (the judge's timing of eager
   and Inductor on this machine, :mod:`ks_inductor.judge.room`) says they beat Inductor's code by
   ``room.EAGER_MARGIN``: the fastest of the three per region. A miss follows the policy: ``fallback`` (Inductor compiles it), ``record`` (also a miss row for
   ``kernelsmith warm --from-misses``) or ``evolve`` (run the optimizer now, within the budget).
3. Hits are swapped into a *copy* of the Dynamo graph as one call of a ``torch.library`` op (see
   :mod:`ks_inductor.compiler.kernel_ops`), and that graph goes to Inductor's ``compile_fx`` with the user's ``mode`` and
   options. Swapping at this level keeps Inductor's caches right: the op's name carries the kernel's hash, so a
   new kernel is a new graph (research note C §0.3 A). Everything that is not a hit is compiled by Inductor as
   usual.
4. Dynamic shapes: a kernel serves the shapes it was verified for. A region with symbolic sizes is looked up at
   the sizes' hints; where its kernel is compiled in, those sizes are specialised (a Dynamo guard), so other
   sizes recompile and meet their own kernels or Inductor.

With nothing swapped (no hits, the graph guard's verdict against the swaps, a failure), what the backend returns
is Inductor's own compile (:class:`InductorAlone`): the graph Dynamo made, untouched by the analysis, compiled
through the callable ``torch.compile(backend="inductor")`` builds, with its config, and returned as it is, so a
call runs no kernelsmith code.

Never worse: any failure (database missing or corrupt, a kernel that does not load, a graph the analysis does not
understand, a compile error with the swapped graph) gives a warning and plain Inductor.

Options, through ``torch.compile(..., options={...})`` (keys prefixed ``kernelsmith.``; all other keys are
Inductor config patches) or the environment:

=========================  ==============================  =======================================
option                     environment                     meaning
=========================  ==============================  =======================================
``kernelsmith.db``         ``KERNELSMITH_DB``              cache URL or path (default: the store's)
``kernelsmith.on_miss``    ``KERNELSMITH_ON_MISS``         ``fallback`` | ``record`` | ``evolve``
``kernelsmith.budget``     ``KERNELSMITH_BUDGET``          candidates judged per region on ``evolve``
``kernelsmith.time_limit`` ``KERNELSMITH_TIME_LIMIT``      seconds per region on ``evolve``
``kernelsmith.min_speedup`` ``KERNELSMITH_MIN_SPEEDUP``    speedup over Inductor a timed kernel needs
                                                           (0: none, not even a measured one)
``kernelsmith.enabled``    ``KERNELSMITH_DISABLE=1``       off: exactly Inductor
``kernelsmith.triton_op``  ``KERNELSMITH_TRITON_OP``       GPU: register hits as triton_op (default on)
``kernelsmith.graph_guard`` ``KERNELSMITH_GRAPH_GUARD``    ``auto`` | ``on`` | ``off``: time the graph
                                                           with its swaps against Inductor alone and
                                                           keep the faster (auto: timed kernels only)
=========================  ==============================  =======================================

The graph guard (:mod:`ks_inductor.compiler.graph_guard`) is what makes "never slower than Inductor" hold for the whole
graph and not only per region; it costs a second Inductor compile and, on the H200 decoder layer, 0.2-0.6 s of runs.
Its result is kept in the kernel database (see :func:`_guard_key` for what it is keyed by). A stored result is
reused once a second process has measured the same verdict (``graph_guard.CONFIRMATIONS``), so that cost is paid
twice per graph, kernel set, machine and Inductor options, not once per process, and one measurement taken under
load does not decide for good; a confirmed result that says the swaps are slower also spares the next compile the
swapped graph.

What a compile that hits the cache does not redo in a new process: tracing the graph's nodes and regions to aten
to find their keys (kept per graph under ``$KERNELSMITH_HOME/analysis``; ``KERNELSMITH_ANALYSIS_CACHE=0`` turns
that off, see :class:`ks_inductor.compiler.analysis_memo.AnalysisMemo`), AOTAutograd and Inductor's own work (the swapped graph
calls only what their caches accept), and importing SQLAlchemy (lookups read the database through its driver alone,
see :mod:`kernel_cache.reader`).
"""

from __future__ import annotations

import collections
import difflib
import logging
import operator
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.fx as fx

from kernel_cache.access import open_store
from kernel_cache.lazy_store import LazyKernelStore
from kernel_cache.record import KernelRecord
from kernel_cache.urls import parse_url
from ks_core.config import SECTIONS, derive
from ks_core.fingerprint import EnvFingerprint
from ks_core.problem_record import Problem
from ks_core.settings import Settings
from ks_inductor.contracts import CompileStore, KernelLookup, SearchStore

log = logging.getLogger(__name__)

ON_MISS_POLICIES = ("fallback", "record", "evolve")
GRAPH_GUARD_MODES = ("auto", "on", "off")
OPTION_PREFIX = "kernelsmith."

# Region statuses, as reported by explain.
HIT = "hit"
MISS = "miss"
SLOWER = "slower"  # a verified kernel exists but is not faster than Inductor here
EVOLVED = "evolved"  # missed, then found by the optimizer during this compile
UNSUPPORTED = "unsupported"
ERROR = "error"
UNUSABLE = "unusable"  # a verified kernel exists but this process cannot run it (see unrunnable_reason)
EAGER = "eager"  # no faster kernel; the judge measured eager's ops faster than Inductor's code, so they are served
# Why a cached kernel without a judged plan is not served, and what gives it one.
NO_PLAN = "its record carries no judged plan, and only a judged plan runs (`kernelsmith warm` judges the region again)"


# What a swap serves in place of Inductor's code for a region.
SERVED = (HIT, EVOLVED, EAGER)


class KernelsmithWarning(UserWarning):
    """Something went wrong and the backend used Inductor instead; the message says what."""


# Options spelled in torch.compile(options=...) as the README spells them -> the BackendOptions field they set.
_OPTION_FIELDS = {src.option[len(OPTION_PREFIX):]: name for name, src in SECTIONS["BackendOptions"].items()
                  if src.option}


def option_names() -> list[str]:
    """Every ``kernelsmith.`` option ``torch.compile(options=...)`` takes, as the README names them."""
    public = {field: name for name, field in _OPTION_FIELDS.items()}
    return [OPTION_PREFIX + public.get(f, f) for f in BackendOptions.__dataclass_fields__]


@dataclass
class BackendOptions:
    # The defaults are the settings' (ks_core.settings), the one place they are written down; each field's
    # variable and option are in ks_core.config.
    db: str | None = Settings.db
    on_miss: str = Settings.on_miss
    budget: int = Settings.budget
    time_limit_s: float | None = Settings.time_limit_s
    min_speedup: float = Settings.min_speedup
    enabled: bool = not Settings.disabled
    triton_op: bool = Settings.triton_op
    judge_backend: str | None = Settings.judge_backend
    # torch.compile refuses mode= together with options=, so the mode for what Inductor compiles can also come
    # from here (or KERNELSMITH_MODE); an explicit mode= wins.
    mode: str | None = Settings.mode
    graph_guard: str = Settings.graph_guard

    @classmethod
    def resolve(cls, options: dict[str, Any] | None) -> tuple[BackendOptions, dict[str, Any]]:
        """Split ``torch.compile(options=...)`` into ours and Inductor's; the environment fills the gaps."""
        o = cls(**derive("BackendOptions"))
        inductor: dict[str, Any] = {}
        for k, v in (options or {}).items():
            if not k.startswith(OPTION_PREFIX):
                inductor[k] = v
                continue
            name = _OPTION_FIELDS.get(k[len(OPTION_PREFIX):], k[len(OPTION_PREFIX):])
            if name not in cls.__dataclass_fields__:
                known = option_names()
                near = difflib.get_close_matches(k, known, n=1)
                raise ValueError(f"unknown kernelsmith option {k!r}"
                                 + (f" (did you mean {near[0]!r}?)" if near else "") + "; known: " + ", ".join(known))
            setattr(o, name, v)
        if o.on_miss not in ON_MISS_POLICIES:
            raise ValueError(f"kernelsmith on_miss={o.on_miss!r}; choose one of {', '.join(ON_MISS_POLICIES)}")
        if o.graph_guard not in GRAPH_GUARD_MODES:
            raise ValueError(f"kernelsmith graph_guard={o.graph_guard!r}; choose one of "
                             f"{', '.join(GRAPH_GUARD_MODES)}")
        return o, inductor


@dataclass
class RegionReport:
    index: int
    kind: str
    ops: str
    key: str | None
    signature: str
    status: str
    speedup: float | None = None
    kernel_id: int | None = None
    note: str = ""
    symbolic: bool = False
    # The region's stored room on this machine (``ks_inductor.judge.room.Room.to_json()``), where it was read.
    room: dict[str, Any] | None = None
    # How a swapped-in kernel runs: "traced judged plan" (a triton_op) or "judged plan" (a custom_op that runs it per
    # call); a kernel with no judged plan that runs here is not swapped in.
    launch: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompileReport:
    """What one compile did: the regions, what was swapped, and why anything fell back."""

    regions: list[RegionReport] = field(default_factory=list)
    swapped: int = 0
    fallback_reason: str | None = None
    analysis_s: float = 0.0
    # Graph nodes and regions traced to aten by the analysis; the rest came from the in-process or on-disk memo.
    traced_nodes: int = 0
    traced_regions: int = 0
    variant: str | None = None  # "triton_op" | "custom_op" | None (nothing swapped)
    guard: Any = None  # ks_inductor.compiler.graph_guard.GuardResult when the graph guard ran
    # Earlier verdicts of the guard on larger sets of swaps, which lost to Inductor alone (``swap_sets``).
    guard_tries: list[Any] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list, repr=False)  # the regions' (not serialized)

    @property
    def hits(self) -> int:
        return sum(r.status in (HIT, EVOLVED) for r in self.regions)

    @property
    def misses(self) -> int:
        return sum(r.status == MISS for r in self.regions)

    @property
    def eager(self) -> int:
        """Regions served by eager's ops (faster than Inductor's code there, and no faster kernel cached)."""
        return sum(r.status == EAGER for r in self.regions)

    def to_json(self) -> dict[str, Any]:
        return {"regions": [r.to_json() for r in self.regions], "swapped": self.swapped, "hits": self.hits,
                "misses": self.misses, "eager": self.eager, "fallback_reason": self.fallback_reason, "analysis_s": self.analysis_s,
                "traced_nodes": self.traced_nodes, "traced_regions": self.traced_regions, "variant": self.variant,
                "guard": self.guard.to_json() if self.guard is not None else None,
                "guard_tries": [g.to_json() for g in self.guard_tries]}


_REPORTS: collections.deque[CompileReport] = collections.deque(maxlen=256)
_STORES: dict[str, LazyKernelStore] = {}
_STORE_LOCK = threading.Lock()
_FINGERPRINT: dict[str | None, Any] = {}


def compile_reports() -> list[CompileReport]:
    """Reports of the compiles this process made with the backend, oldest first (the last 256)."""
    return list(_REPORTS)


def clear_reports() -> None:
    _REPORTS.clear()


def current_fingerprint(judge_backend: str | None = None) -> Any:
    """This machine's fingerprint, as the judge computes it (memoized per process)."""
    if judge_backend not in _FINGERPRINT:
        from ks_inductor.judge.backends import current_fingerprint as judge_fingerprint

        _FINGERPRINT[judge_backend] = judge_fingerprint(judge_backend)
    return _FINGERPRINT[judge_backend]


def shared_store(url: str | None) -> LazyKernelStore:
    """One store per database per process, opened lazily (:func:`kernel_cache.access.open_store`): lookups on a
    SQLite file go through the driver alone; the full KernelStore (and SQLAlchemy) is opened when something else
    is asked for, or for a database it must create, migrate or refuse."""
    location = parse_url(url)
    # A SQLite file the user named in a folder that does not exist is a mistyped path: creating the folder would
    # hide the mistake behind an empty cache. Only the default cache's folder is created.
    if url and location.sqlite_file is not None and not location.sqlite_file.parent.is_dir():
        from kernel_cache.errors import DatabaseUnavailableError

        raise DatabaseUnavailableError(f"no kernel cache at {url}: the folder {location.sqlite_file.parent} does not "
                                       "exist")
    with _STORE_LOCK:
        store = _STORES.get(location.url)
        if store is None:
            store = _STORES[location.url] = open_store(location, lazy=True)
        return store


def forget_stores() -> None:
    """Close the cached stores (tests; a long-lived process that swaps databases)."""
    with _STORE_LOCK:
        for s in _STORES.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass
        _STORES.clear()


def _warn(msg: str) -> None:
    warnings.warn(f"kernelsmith: {msg}; using Inductor", KernelsmithWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------- analysis


@dataclass
class _Hit:
    region: Any
    record: Any  # a KernelRecord, or an EagerChoice
    report: RegionReport


@dataclass(frozen=True)
class EagerChoice:
    """A region served by eager's own ops: what the graph guard keys and reads of a swap, as of a kernel record."""

    problem_key: str
    speedup_inductor: float  # Inductor's time over eager's, as the judge measured them
    id: str = "eager"
    sha256: str = "eager"
    timed: bool = True


def stored_room(store: KernelLookup, problem_key: str, fp: EnvFingerprint) -> dict[str, Any] | None:
    """The room stored for a region's key on this machine, or None (none measured)."""
    return store.room(problem_key, fp.id)


def _eager_choice(room: dict[str, Any] | None, problem: Problem) -> EagerChoice | None:
    """Eager's ops for ``problem`` where its room (``ks_inductor.judge.room``) says they beat Inductor's code by the
    margin on this machine; None otherwise."""
    from ks_inductor.judge.room import Room

    if not room:
        return None
    r = Room.from_json(room)
    return EagerChoice(problem.key, r.eager_gain or 1.0) if r.serves_eager else None


def analyze(gm: fx.GraphModule, opts: BackendOptions, act_on_miss: bool = True,
            store: CompileStore | None = None) -> tuple[CompileReport, list[_Hit], CompileStore]:
    """Regions, problems, lookups and the on-miss policy. Raises only for a failure of the whole analysis.
    ``store``: what to look kernels up in instead of ``opts.db`` (explain passes an empty one when there is no
    cache, so that it creates none)."""
    from ks_inductor.compiler import regions as rg

    t0 = time.perf_counter()
    report = CompileReport()
    fp = current_fingerprint(opts.judge_backend)
    device = "cpu" if fp.backend == "cpu-interpret" else "cuda"
    store = store if store is not None else shared_store(opts.db)
    part = rg.partition(gm)
    hits: list[_Hit] = []
    for region in part.regions:
        rr = RegionReport(index=region.index, kind=region.kind, ops=region.op_text, key=None, signature="",
                          status=MISS, symbolic=region.symbolic)
        report.regions.append(rr)
        try:
            problem = rg.region_problem(gm, region)
        except Exception as e:  # noqa: BLE001 - a region we cannot render is left to Inductor
            rr.status, rr.note = UNSUPPORTED, f"cannot build a problem: {e}"[:300]
            continue
        rr.key, rr.signature = problem.key, problem.signature()
        report.problems.append(problem)
        if region.device != device:
            rr.status, rr.note = UNSUPPORTED, f"region on {region.device}; cached kernels here are for {device}"
            continue
        record = store.lookup(problem.key, fp)
        if record is None and act_on_miss:
            record = _on_miss(opts, store, problem, fp, rr)
        if record is not None:
            rr.kernel_id = record.id
            rr.speedup = record.speedup_inductor
            # min_speedup <= 0 asks for no measured speedup at all (tests of the mechanism, experiments).
            if record.timed and opts.min_speedup > 0 and (record.speedup_inductor is None
                                                          or record.speedup_inductor < opts.min_speedup):
                rr.status = SLOWER
                rr.note = (f"kernel {record.id}: speedup over Inductor {record.speedup_inductor} < "
                           f"{opts.min_speedup}")
                record = None
            elif rr.status != EVOLVED:
                rr.status = HIT
        if record is None:
            # The fastest of three: with no kernel to serve, eager's ops where they beat Inductor's code.
            rr.room = stored_room(store, problem.key, fp)
            eager = _eager_choice(rr.room, problem)
            if eager is None:
                continue
            rr.status, rr.speedup = EAGER, eager.speedup_inductor
            rr.note = (f"eager's ops, {eager.speedup_inductor:.2f}x Inductor's code here"
                       + (f" ({rr.note})" if rr.note else ""))
            record = eager
        hits.append(_Hit(region, record, rr))
    hits = _drop_unrunnable(hits)
    for op in sorted(set(part.unsupported)):
        report.regions.append(RegionReport(index=-1, kind="-", ops=op, key=None, signature="", status=UNSUPPORTED,
                                           note=_unsupported_why(op)))
    rg.save_analysis(part)
    report.traced_nodes = part.traced_nodes
    report.traced_regions = sum(r.traced for r in part.regions)
    report.analysis_s = time.perf_counter() - t0
    return report, hits, store


def _unsupported_why(ops: str) -> str:
    from ks_inductor.compiler.regions import UNSUPPORTED_WHY

    return next((UNSUPPORTED_WHY[o] for o in ops.split("+") if o in UNSUPPORTED_WHY), "no region takes this operation")


def unrunnable_reason(device: str, record: KernelRecord | None = None) -> str | None:
    """Why a cached kernel for tensors on ``device`` cannot run in this process; None when it can. Kernels for
    CPU tensors are Triton programs only the interpreter runs: without ``TRITON_INTERPRET=1`` Triton cannot
    launch them, whatever the cache holds. A record without a judged plan is never run: what would run is its
    forward, the candidate's own Python, which no judge ran as it would run here."""
    if device == "cpu" and not Settings.read("triton_interpret"):
        return "cached kernels for CPU run only under TRITON_INTERPRET=1"
    if record is not None and not record.plan:
        return NO_PLAN
    return None


def _drop_unrunnable(hits: list[_Hit]) -> list[_Hit]:
    """The hits this process can run; the others' regions are marked :data:`UNUSABLE`, with the reason."""
    kept = []
    for h in hits:
        reason = None if isinstance(h.record, EagerChoice) else unrunnable_reason(h.region.device, h.record)
        if reason is None:
            kept.append(h)
        else:
            h.report.status, h.report.note = UNUSABLE, f"kernel {h.record.id} not used: {reason}"
    return kept


def _searchable(store: CompileStore) -> SearchStore:
    """What a search on a miss writes to: the compile's lazy store's full store, or a store that is one."""
    if isinstance(store, LazyKernelStore):
        return store.full()
    if not isinstance(store, SearchStore):
        raise TypeError(f"{type(store).__name__} cannot store a search: it is not a SearchStore")
    return store


def _on_miss(opts: BackendOptions, store: CompileStore, problem: Problem, fp: EnvFingerprint,
             rr: RegionReport) -> KernelRecord | None:
    if opts.on_miss == "fallback":
        return None
    if opts.on_miss == "record":
        try:
            store.record_miss(problem, fp)
            rr.note = "miss recorded"
        except Exception as e:  # noqa: BLE001
            _warn(f"could not record a miss for {problem.key}: {e}")
        return None
    try:
        from ks_inductor.evolve import EvolveConfig, evolve_problem

        summary = evolve_problem(problem, EvolveConfig(budget=int(opts.budget), time_limit_s=opts.time_limit_s,
                                                       backend=opts.judge_backend), _searchable(store),
                                 progress=False)
        rr.note = f"evolved: {summary.judged} judged, {summary.accepted} accepted"
    except Exception as e:  # noqa: BLE001
        _warn(f"evolving {problem.key} failed: {type(e).__name__}: {e}")
        return None
    record = store.lookup(problem.key, fp)
    if record is not None:
        rr.status = EVOLVED
    return record


# ----------------------------------------------------------------------------------------- rewrite


def specialize(hits: list[_Hit]) -> None:
    """Guard the symbolic sizes of the hits' regions to their hints: a kernel was verified for these shapes only.
    A Dynamo guard cannot be taken back, so this is done only once the swapped graph is to be compiled."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    from ks_inductor.compiler.regions import example_value

    for h in hits:
        if not h.region.symbolic:
            continue
        for a in h.region.inputs:
            v = example_value(a)
            sizes = (*v.shape, *v.stride()) if isinstance(v, torch.Tensor) else (v,)
            for s in sizes:
                if isinstance(s, torch.SymInt):
                    guard_int(s)


def rewrite(gm: fx.GraphModule, hits: list[_Hit], use_triton_op: bool) -> tuple[fx.GraphModule, int]:
    """A copy of ``gm`` with each hit region replaced by one call of its kernel op; ``gm`` and Dynamo's shape
    guards are left as they are (see :func:`specialize`)."""
    from torch.fx.passes.tools_common import legalize_graph

    from ks_inductor.compiler import kernel_ops as ko
    from ks_inductor.compiler import regions as rg
    from ks_inductor.judged_plan import judged_plan

    graph = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(gm.graph, val_map)
    graph.output(out)
    swapped = 0
    for hit in hits:
        region = hit.region
        try:
            reference = rg.region_module(gm, region)
            in_vals = [rg.example_value(a) for a in region.inputs]
            out_vals = [rg.example_value(o) for o in region.outputs]
            spec = ko.OpSpec([ko.input_kind(v) for v in in_vals], len(out_vals), [v.dtype for v in out_vals])
            if isinstance(hit.record, EagerChoice):
                op = ko.register_eager_op(hit.record.problem_key, reference, spec)
            else:
                # The op runs (or, as a triton_op, traces) the plan the kernel's verdict was reached with, never the
                # kernel's forward: nothing of the candidate's Python but its Triton kernels is imported here.
                judged, why = judged_plan(hit.record, hit.region.problem)
                if judged is None:  # the region stays with Inductor: the forward is no stand-in for the plan
                    hit.report.status, hit.report.note = UNUSABLE, f"kernel {hit.record.id} not used: {why}"
                    continue
                kernel = ko.served_kernel(hit.record)
                traced = use_triton_op
                if traced:
                    untraced = judged.untraceable(in_vals) or ko.padded_by_inductor(in_vals)
                    if untraced:
                        traced = False
                        log.debug("kernel %s runs as a custom op: its judged plan is not traced (%s)",
                                  hit.record.id, untraced)
                hit.report.launch = "traced judged plan" if traced else "judged plan"
                op = ko.register_region_op(kernel, hit.region.problem.key, reference, spec, triton=traced,
                                           judged=judged)
        except Exception as e:  # noqa: BLE001 - this region stays with Inductor
            hit.report.status = ERROR
            hit.report.note = f"{type(e).__name__}: {e}"[:300]
            _warn(f"kernel {hit.record.id} for region {region.index} ({region.op_text}) not used: {e}")
            continue
        nodes = [val_map[n] for n in region.nodes]
        with graph.inserting_after(nodes[-1]):
            call = graph.call_function(op, tuple(val_map[a] for a in region.inputs))
        fake_out = tuple(torch.empty_like(v, memory_format=torch.contiguous_format) for v in out_vals)
        call.meta["example_value"] = fake_out[0] if len(out_vals) == 1 else fake_out
        if len(out_vals) == 1:
            results = [call]
        else:
            results = []
            anchor = call
            for i, v in enumerate(fake_out):
                with graph.inserting_after(anchor):
                    # operator.getitem itself: AOTAutograd's cache refuses a graph calling a function it does not
                    # know, and every compile of the graph would then trace it again
                    gi = graph.call_function(operator.getitem, (call, i))
                gi.meta["example_value"] = v
                results.append(gi)
                anchor = gi
        for o, r in zip(region.outputs, results):
            val_map[o].replace_all_uses_with(r)
            val_map[o] = r  # later regions that read this output now read the kernel's result
        for n in reversed(nodes):
            graph.erase_node(n)
        swapped += 1
    new_gm = fx.GraphModule(gm, graph)
    legalize_graph(new_gm)
    new_gm.graph.lint()
    new_gm.recompile()
    _keep_dynamo_metadata(gm, new_gm)
    return new_gm, swapped


def _keep_dynamo_metadata(gm: fx.GraphModule, new_gm: fx.GraphModule) -> None:
    """AOTAutograd reads which inputs are parameters (static addresses) from Dynamo's marks on the graph module
    and its placeholders. A copy without them looks like a graph from elsewhere: under CUDA graphs every weight
    would then be copied into the graph's buffers on each call (measured: 0.34 ms more per decode step of a
    Llama-style layer on an H200)."""
    # legalize_graph rebuilt the nodes, so placeholders are matched by name (the copy keeps names and order)
    new_ph = {n.name: n for n in new_gm.graph.find_nodes(op="placeholder")}
    sources = {}
    for old in gm.graph.find_nodes(op="placeholder"):
        if old.name not in new_ph:
            return
        if hasattr(old, "_dynamo_source"):
            sources[old.name] = old._dynamo_source
        elif "grapharg" in old.meta:
            sources[old.name] = old.meta["grapharg"].source
    if "dynamo_compile_id" not in gm.meta or len(sources) != len(new_ph):
        return  # not Dynamo's graph, or not all its marks: AOTAutograd treats the copy as a plain graph
    for name, source in sources.items():
        new_ph[name]._dynamo_source = source
    new_gm.meta.update({k: v for k, v in gm.meta.items() if k not in new_gm.meta})
    if hasattr(gm, "_param_name_to_source"):
        new_gm._param_name_to_source = gm._param_name_to_source


# ----------------------------------------------------------------------------------------- entry point


def _inductor_wrapper(mode: str | None, inductor_opts: dict[str, Any]) -> Any:
    """The callable ``torch.compile(backend="inductor", mode=mode, options=inductor_opts)`` hands Dynamo, or None
    where this torch has none to build. Building it resolves the mode and options exactly as Inductor does for
    itself: the mode's options first, the user's over them, ``-`` in a name read as ``_``, unknown names and
    wrongly typed values refused."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None:
        return None
    return wrapper(mode, dict(inductor_opts) or None, None)


def _inductor_patches(mode: str | None, inductor_opts: dict[str, Any]) -> dict[str, Any]:
    """Inductor's config patches for ``mode`` and ``inductor_opts``, as ``backend="inductor"`` would apply them."""
    wrapper = _inductor_wrapper(mode, inductor_opts)
    if wrapper is not None:
        return dict(wrapper.config)
    patches: dict[str, Any] = {}
    if mode and mode != "default":
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    patches.update({k.replace("-", "_"): v for k, v in inductor_opts.items()})
    return patches


class InductorAlone:
    """Inductor's own compile of the graph Dynamo handed the backend: what ``torch.compile(backend="inductor")``
    with the same mode and options makes of it. The same entry (the callable torch.compile builds for Inductor),
    the same config, the graph as Dynamo made it (the analysis reads it and swaps into a copy) and the compiled
    callable returned as it is, with nothing of kernelsmith's around it per call.

    It is compiled at most once per backend call: Inductor's pre-grad passes rewrite the graph they are given in
    place, so a second compile of ``gm`` would not start from Dynamo's graph. A compile the graph guard times
    where the user's options record CUDA graphs (which must not record inside the backend) is made of a copy."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list[Any], mode: str | None,
                 inductor_opts: dict[str, Any]) -> None:
        self.gm = gm
        self.example_inputs = example_inputs
        self._wrapper = _inductor_wrapper(mode, inductor_opts)
        self.patches = dict(self._wrapper.config) if self._wrapper is not None else _inductor_patches(
            mode, inductor_opts)
        self._compiled: Any = None
        self._timed: Any = None

    @property
    def cudagraphs(self) -> bool:
        return bool(self.patches.get("triton.cudagraphs", torch._inductor.config.triton.cudagraphs))

    def __call__(self) -> Any:
        """The compiled graph, as Inductor alone would serve it."""
        if self._compiled is None:
            self._compiled = self._compile(self.gm, {})
        return self._compiled

    def for_timing(self) -> Any:
        """Inductor's own compile, runnable inside the backend: without CUDA graphs (of a copy of the graph)
        where the user's options record them, else the compiled graph itself."""
        if not self.cudagraphs:
            return self()
        if self._timed is None:
            self._timed = self._compile(graph_copy(self.gm), {"triton.cudagraphs": False})
        return self._timed

    def _compile(self, gm: fx.GraphModule, extra: dict[str, Any]) -> Any:
        if self._wrapper is not None and not extra:
            return self._wrapper(gm, self.example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, self.example_inputs, config_patches={**self.patches, **extra})


def graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that Inductor compiles as it would ``gm``: the same nodes in the same order, their
    metadata, and Dynamo's marks of which inputs are parameters; the modules and tensors are shared."""
    import copy

    new_gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    _keep_dynamo_metadata(gm, new_gm)
    return new_gm


def kernelsmith_backend(gm: fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
                        options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """The backend Dynamo calls. Compiles ``gm`` with Inductor after swapping in cached kernels; where nothing is
    swapped, what it returns is Inductor's own compile of ``gm`` (:class:`InductorAlone`)."""
    opts, inductor_opts = BackendOptions.resolve(options)
    inductor = InductorAlone(gm, example_inputs, mode or opts.mode, inductor_opts)
    if not opts.enabled:
        return inductor()
    report = CompileReport()
    hits: list[_Hit] = []
    store = None
    try:
        report, hits, store = analyze(gm, opts)
    except Exception as e:  # noqa: BLE001 - database gone, corrupt, analysis bug: Inductor alone
        report.fallback_reason = f"{type(e).__name__}: {e}"
        _warn(f"kernel cache or region analysis unavailable ({report.fallback_reason})")
    _publish(report)
    variants: list[bool] = []
    if hits:
        on_gpu = any(h.region.device == "cuda" for h in hits)
        if on_gpu and opts.triton_op and not Settings.read("triton_interpret"):
            variants.append(True)
        variants.append(False)
    if any(r.status == UNUSABLE for r in report.regions):
        _warn(next(r.note for r in report.regions if r.status == UNUSABLE))
    served = {id(h): (h.report.status, h.report.note) for h in hits}
    for use_triton_op in variants:
        name = "triton_op" if use_triton_op else "custom_op"
        sets = swap_sets(hits)
        for i, subset in enumerate(sets):
            for h in subset:
                h.report.status, h.report.note = served[id(h)]
            outcome, compiled = _compile_swapped(gm, example_inputs, subset, use_triton_op, name, opts, inductor,
                                                 report, store)
            if outcome != SLOWER or i + 1 == len(sets):
                break
            # Inductor alone beat the graph with every swap. Eager's regions are opaque ops that run the region's
            # graph in Python on each call, host time that a launch-bound graph (a decode step) pays in full, while
            # a kernel is launched from Inductor's own wrapper: the kernels are tried alone.
            report.guard_tries.append(report.guard)
            kept_ids = {id(k) for k in sets[i + 1]}
            for h in hits:
                if id(h) not in kept_ids and h.report.status == SLOWER:
                    h.report.note = ("eager's ops swapped in made the graph slower than Inductor alone (graph "
                                     "guard); the kernels were tried without them")
        if outcome == SLOWER:
            _log(report)
            return inductor()
        if outcome == "kept":
            _log(report)
            return compiled
        if outcome == "none":
            break
    for rr in report.regions:
        if rr.status in SERVED:
            rr.status, rr.note = ERROR, rr.note or "kernel not used (see warnings)"
    _log(report)
    return inductor()


def swap_sets(hits: list[_Hit]) -> list[list[_Hit]]:
    """The sets of hits to swap in, in the order they are tried while the graph guard finds the graph slower
    than Inductor alone: every hit, then the kernels without eager's regions (where there are both)."""
    kernels = [h for h in hits if not isinstance(h.record, EagerChoice)]
    return [hits, kernels] if kernels and len(kernels) < len(hits) else [hits]


def _compile_swapped(gm: fx.GraphModule, example_inputs: list[Any], hits: list[_Hit], use_triton_op: bool, name: str,
                     opts: BackendOptions, inductor: InductorAlone, report: CompileReport,
                     store: CompileStore | None) -> tuple[str, Any]:
    """Compile ``gm`` with ``hits`` swapped in as ``name`` ops, and let the graph guard decide: ("kept", the
    compiled graph); (SLOWER, None) where Inductor alone is faster (``inductor()`` is then the graph to serve);
    ("failed", None) where the swapped graph did not compile (the next variant is tried); ("none", None) where
    no hit could be swapped."""
    from torch._inductor.compile_fx import compile_fx

    from ks_inductor.compiler import graph_guard as gg

    try:
        new_gm, swapped = rewrite(gm, hits, use_triton_op)
        if not swapped:
            return "none", None
    except Exception as e:  # noqa: BLE001 - next variant, then plain Inductor
        _variant_failed(report, name, e)
        return "failed", None
    guard = gg.GuardPlan.make(gm, example_inputs, _swapped_kernels(opts, hits), inductor.patches,
                              lambda: current_fingerprint(opts.judge_backend), name, store)
    if guard is not None and guard.known is not None and not guard.known.kept:
        # Measured before for exactly this graph, kernels, machine and options: the swaps made it slower. No
        # compile of the swapped graph only to drop it, and no size specialised for it.
        report.guard = guard.known
        _drop_swaps(report, hits, guard.known)
        return SLOWER, None
    try:
        served = [h for h in hits if h.report.status in SERVED]
        if guard is not None and guard.measures:
            # Inductor's own graph is compiled before any size is specialised for the swaps: where they lose, it is
            # what is served, and it must be the graph Inductor alone would have compiled.
            inductor.for_timing()
            if inductor.cudagraphs and any(h.region.symbolic for h in served):
                inductor()
        specialize(served)
        compiled = compile_fx(new_gm, example_inputs, config_patches=inductor.patches)
    except Exception as e:  # noqa: BLE001 - next variant, then plain Inductor
        _variant_failed(report, name, e)
        return "failed", None
    report.swapped = swapped
    report.variant = name
    if (report.fallback_reason or "").startswith("graph guard:"):
        report.fallback_reason = None  # a larger set's verdict; this set is judged below
    if guard is not None:
        try:
            report.guard = guard.decide(new_gm, example_inputs, compiled, inductor.patches, inductor.for_timing)
            if not report.guard.kept:
                _drop_swaps(report, hits, report.guard)
                return SLOWER, None
        except Exception as e:  # noqa: BLE001 - the guard itself failed: the per-region decision stands
            log.warning("kernelsmith: graph guard failed (%s: %s); keeping the swaps", type(e).__name__, e)
    return "kept", compiled


def _variant_failed(report: CompileReport, name: str, e: Exception) -> None:
    report.fallback_reason = f"compile with {name} kernels failed: {type(e).__name__}: {e}"[:500]
    log.debug("compile with %s kernels failed", name, exc_info=True)
    _warn(report.fallback_reason)


def _swapped_kernels(opts: BackendOptions, hits: list[_Hit]) -> list[Any] | None:
    """The records of the kernels swapped in, for the graph guard; None where the guard does not run
    (``graph_guard`` off, or ``auto`` with an untimed kernel among them)."""
    if opts.graph_guard == "off" or (opts.graph_guard == "auto" and not all(h.record.timed for h in hits)):
        return None
    return [h.record for h in hits if h.report.status in SERVED]


def _drop_swaps(report: CompileReport, hits: list[_Hit], result: Any) -> None:
    report.swapped, report.variant = 0, None
    report.fallback_reason = f"graph guard: {result.note}"
    for h in hits:
        if h.report.status in SERVED:
            h.report.status = SLOWER
            h.report.note = "swapped graph not faster than Inductor alone (graph guard)"


def _publish(report: CompileReport) -> None:
    _REPORTS.append(report)


def _log(report: CompileReport) -> None:
    n = len([r for r in report.regions if r.index >= 0])
    log.info("kernelsmith: %d regions, %d hits (%d swapped, %s), %d misses, analysis %.2fs", n, report.hits,
             report.swapped, report.variant or "-", report.misses, report.analysis_s)
    for r in report.regions:
        if r.index >= 0:
            log.info("  region %d %-9s %-7s %s %s %s", r.index, r.kind, r.status, (r.key or "-")[:12], r.ops[:60],
                     r.note)

