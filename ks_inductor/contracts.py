"""The seams between kernelsmith's parts, named: what the compile backend, the optimizer and ``warm`` ask of the
kernel cache, of the judge and of a region executor.

Each is a :class:`typing.Protocol`, satisfied structurally: :class:`kernel_cache.store.KernelStore` and
:class:`kernel_cache.lazy_store.LazyKernelStore` are caches, :class:`ks_inductor.judge.Judge` is a judge,
:class:`ks_inductor.warm.parallel.RegionThreads` and :class:`ks_inductor.warm.ray_cluster.RayExecutor` are
executors, without naming these protocols. The parts annotate what they accept with them, so a part depends on the
seam rather than on another part's class. This module sits under the optimizer, ``warm`` and the backend and over
the cache's and the judge's plain types; none of those imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kernel_cache.record import KernelRecord, StepRecord
from ks_core.fingerprint import EnvFingerprint
from ks_core.problem_record import Problem

if TYPE_CHECKING:
    from ks_inductor.judge.room import Room
    from ks_inductor.judge.verdict import EvalResult

__all__ = ["Apply", "CompileStore", "JudgeDevice", "KernelLookup", "Region", "RegionExecutor", "RegionSource",
           "RoomJudge", "SearchJudge", "SearchStore"]


# ------------------------------------------------------------------------------------------ the kernel cache


@runtime_checkable
class KernelLookup(Protocol):
    """What a compile and ``explain`` read of a cache: the kernel for a key here, a graph guard's decision, a
    region's stored room."""

    def lookup(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None: ...

    def guard_decision(self, key: str) -> dict[str, Any] | None: ...

    def room(self, problem_key: str, fingerprint_id: str) -> dict[str, Any] | None: ...


@runtime_checkable
class CompileStore(KernelLookup, Protocol):
    """What the compile backend also writes (the misses it records, the graph guard's decisions), and why a
    key's latest search stored no kernel (``explain``)."""

    def last_why(self, problem_key: str) -> str | None: ...

    def record_miss(self, problem: Problem, fingerprint: EnvFingerprint) -> None: ...

    def put_guard_decision(self, key: str, fingerprint_id: str, result: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SearchStore(KernelLookup, Protocol):
    """What the optimizer and ``warm`` read and write: a search's problem, run and state, its steps and
    verdicts, the winner, the region's room, and the misses a warm takes its regions from."""

    def upsert_problem(self, problem: Problem) -> None: ...

    def start_run(self, problem_key: str, fingerprint: EnvFingerprint, config: dict[str, Any]) -> str: ...

    def latest_run(self, problem_key: str, fingerprint: EnvFingerprint,
                   unfinished_only: bool = True) -> str | None: ...

    def save_run_state(self, run_id: str, state: dict[str, Any]) -> None: ...

    def load_run_state(self, run_id: str) -> dict[str, Any] | None: ...

    def finish_run(self, run_id: str, summary: dict[str, Any]) -> None: ...

    def add_step(self, step: StepRecord) -> int: ...

    def steps(self, run_id: str | None = None, problem_key: str | None = None) -> list[StepRecord]: ...

    def add_evaluation(self, problem_key: str, candidate_hash: str, result: Any,
                       run_id: str | None = None) -> int: ...

    def get_evaluation(self, problem_key: str, candidate_hash: str,
                       fingerprint_id: str) -> dict[str, Any] | None: ...

    def add_kernel(self, record: KernelRecord) -> int: ...

    def merge(self, problems: list[Problem], records: list[KernelRecord]) -> list[Any]: ...

    def put_room(self, problem_key: str, fingerprint_id: str, room: dict[str, Any]) -> None: ...

    def misses(self) -> list[dict[str, Any]]: ...

    def clear_miss(self, problem_key: str) -> None: ...


# ------------------------------------------------------------------------------------------------ the judge


class JudgeDevice(Protocol):
    """The judge's backend as a search reads it: where candidates run (``cuda``, or ``cpu`` for the
    interpreter)."""

    device: str


@runtime_checkable
class SearchJudge(Protocol):
    """The judge as the optimizer uses it: verdicts in the background or at once, the fingerprint its verdicts
    are stored under, the devices it spreads them over."""

    @property
    def fingerprint(self) -> EnvFingerprint: ...

    @property
    def device_count(self) -> int: ...

    backend: JudgeDevice

    def submit(self, problem: Problem, source: str, timing: bool | None = None, final: bool = False,
               deadline: float | None = None) -> Future[EvalResult]: ...

    def evaluate(self, problem: Problem, source: str, timing: bool | None = None, final: bool = False,
                 deadline: float | None = None) -> EvalResult: ...

    def release(self, problem: Problem) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class RoomJudge(SearchJudge, Protocol):
    """A judge that also measures a region's room (its baselines against its floor): what orders a warm's
    searches and settles the regions near their floor."""

    def room(self, problem: Problem, deadline: float | None = None) -> Room: ...

    def submit_room(self, problem: Problem, deadline: float | None = None) -> Future[Room]: ...


# ------------------------------------------------------------------------------------------- region executors

# A warm's region: its row of the summary (ks_inductor.warm.run.WarmItem) and its problem.
Region = tuple[Any, Problem]
# What an executor hands each region's outcome (ks_inductor.warm.region.evolve_region's JSON) to.
Apply = Callable[[Any, dict[str, Any]], None]


class RegionSource(Protocol):
    """The regions a warm hands its executor, in the order their searches start
    (:class:`ks_inductor.warm.rooms.RegionQueue`)."""

    total: int
    settled: list[Any]  # (item, room) of the regions whose rooms settled them

    @property
    def exhausted(self) -> bool: ...

    def take(self, idle: int = 0) -> Region | None: ...

    def poll(self, idle: int = 0) -> None: ...

    def waiting(self) -> list[Future[Room]]: ...

    def abandon(self) -> list[Any]: ...


@runtime_checkable
class RegionExecutor(Protocol):
    """Where a warm's searches run. ``local``: in this process, on this host's judge (``judge``, shared with
    the rooms it measures, and ``gpu``, the sampler its view shows); otherwise elsewhere, each search with a judge
    of its own, so the rooms, the code generation ahead and the GPU view are not this process's to give.
    ``workers``: searches at once."""

    local: bool
    workers: int
    judge: SearchJudge | None
    gpu: Any

    def fingerprint(self, config: Any) -> EnvFingerprint: ...

    def run(self, regions: RegionSource, config: Any, store: SearchStore, deadline: float | None, apply: Apply,
            console: Any) -> None: ...

    def close(self) -> None: ...
