"""Cache warming: evolve a verified kernel for each distinct key of a model's regions (or a problem folder, or the
recorded misses) before the model is compiled.

Warming is resumable: a key that already has a verified kernel with its judged plan for this machine is skipped
(``force`` re-runs it), and the optimizer resumes an unfinished run of a key by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ks_core.fingerprint import EnvFingerprint
from ks_inductor.contracts import RegionExecutor, RoomJudge, SearchJudge, SearchStore
from ks_inductor.warm.region import evolve_region, region_config

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig
    from ks_inductor.gpu_util import GpuSampler
    from ks_inductor.warm.prefetch import CodegenPrefetch

log = logging.getLogger(__name__)


@dataclass
class WarmItem:
    key: str
    name: str
    origin: str
    signature: str
    status: str = "pending"  # skipped | found | no-kernel | not-run (out of time) | failed
    judged: int = 0
    accepted: int = 0
    best_speedup: float | None = None
    timed: bool = True
    wall_s: float = 0.0
    note: str = ""
    worker: str = ""  # where the search ran, when not here (a Ray worker: node and pid)
    # The region's room as the judge measured it before its search (``Room.to_json()``), and the share of the time
    # limit its search got from it.
    room: dict[str, Any] | None = None
    time_limit_s: float | None = None


@dataclass
class WarmSummary:
    items: list[WarmItem] = field(default_factory=list)
    wall_s: float = 0.0
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # Per local GPU over the searches: mean and max utilisation in percent and the samples taken
    # (ks_inductor.gpu_util.GpuSampler.summary); empty on a CPU, with Ray, or with nothing to evolve.
    gpu_util: list[dict[str, Any]] = field(default_factory=list)
    gpu_util_source: str | None = None

    @property
    def found(self) -> int:
        return sum(i.status in ("found", "skipped") for i in self.items)

    @property
    def settled(self) -> int:
        return sum(i.status == "settled" for i in self.items)

    def to_json(self) -> dict[str, Any]:
        return {"items": [asdict(i) for i in self.items], "wall_s": self.wall_s, "fingerprint": self.fingerprint,
                "found": self.found, "settled": self.settled, "judged": sum(i.judged for i in self.items),
                "gpu_util": self.gpu_util, "gpu_util_source": self.gpu_util_source}

    def table(self) -> Any:
        from rich.table import Table

        from ks_inductor.judge.room import room_cell

        settled = f", {self.settled} settled by their baselines" if self.settled else ""
        t = Table(title=f"kernelsmith warm: {self.found}/{len(self.items)} keys have a verified kernel{settled} "
                        f"({self.wall_s:.0f}s)", caption=self.gpu_text() or None)
        for col in ("key", "region", "inputs", "room", "status", "judged", "accepted", "best speedup", "s"):
            t.add_column(col, overflow="fold")
        colour = {"found": "green", "skipped": "cyan", "settled": "cyan", "no-kernel": "yellow", "not-run": "yellow",
                  "failed": "red"}
        for i in self.items:
            sp = "-" if i.best_speedup is None else f"{i.best_speedup:.2f}x"
            if i.status in ("found", "skipped") and not i.timed:
                sp = "untimed"
            t.add_row(i.key[:16], i.name, i.signature, room_cell(i.room),
                      f"[{colour.get(i.status, 'white')}]{i.status}[/]", str(i.judged), str(i.accepted), sp,
                      f"{i.wall_s:.0f}")
        return t

    def gpu_text(self) -> str:
        if not self.gpu_util:
            return ""
        return "average GPU utilisation: " + ", ".join(f"GPU {g['gpu']} {g['mean']:.0f}%" for g in self.gpu_util)


# ----------------------------------------------------------------------------------------- warming


def warm(problems: Sequence[Problem], store: SearchStore, config: EvolveConfig | None = None,
         judge: SearchJudge | None = None, force: bool = False, console: Any = None, origin: str = "model",
         total_time_s: float | None = None, executor: RegionExecutor | None = None) -> WarmSummary:
    """Evolve a kernel for each distinct problem key that has none yet for this machine.

    ``config.time_limit_s`` bounds each key's search; ``total_time_s`` bounds the whole run: each key gets at most
    what is left of it, and keys not reached in time are reported ``not-run``.

    One plan, two executors: the keys that need a search are found here (lookups only), then either searched here
    one after another with the local judge (``executor`` None), or handed to ``executor``: several at once in this
    process (:class:`ks_inductor.warm.parallel.RegionThreads`), or one search per Ray worker, each with a judge of
    its own (:class:`ks_inductor.warm.ray_cluster.RayExecutor`).
    Every region's outcome comes back as :func:`evolve_region`'s JSON and is read the same way in both cases."""
    from rich.console import Console

    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.evolver import search_judge
    from ks_inductor.judge.backends import current_fingerprint
    from ks_inductor.warm.parallel import LockedStore, RegionThreads
    from ks_inductor.warm.rooms import RegionQueue, settle_threshold

    console = console or Console(stderr=True)
    config = config or EvolveConfig()
    own_judge = judge is None
    # The judge (and its worker processes) starts only when a key actually needs evolving: re-warming a warm
    # cache is lookups only. On a cluster the kernels are for the workers' hardware, not the driver's.
    if judge is not None:
        fp = judge.fingerprint
    elif executor is not None:
        fp = executor.fingerprint(config)
    else:
        fp = current_fingerprint(config.backend)
    t0 = time.perf_counter()
    summary = WarmSummary(fingerprint=fp.to_json())
    distinct: dict[str, Problem] = {}
    for p in problems:
        distinct.setdefault(p.key, p)
    todo: list[tuple[WarmItem, Problem]] = []
    for n, (key, problem) in enumerate(distinct.items(), 1):
        item = WarmItem(key=key, name=problem.name, origin=origin, signature=problem.signature())
        summary.items.append(item)
        existing = store.lookup(key, fp)
        # A kernel without a judged plan serves nothing (the backend and serving run plans only): searched again.
        if existing is not None and existing.plan and not force:
            item.status, item.best_speedup, item.timed = "skipped", existing.speedup_inductor, existing.timed
            item.note = f"kernel {existing.id} already verified"
            console.print(f"[{n}/{len(distinct)}] {problem.name} {key[:12]}: [cyan]cached[/] (kernel {existing.id})")
            continue
        todo.append((item, problem))
    local = executor is None or executor.local
    made = None  # a judge made here for the rooms, which the searches then share
    at = settle_threshold(config, fp)
    queue = RegionQueue(todo)
    rooms = False
    if todo and local and at is not None:
        if judge is None:
            judge = executor.judge if executor is not None else None
            if judge is None:
                judge = made = search_judge(config)
            if executor is not None and executor.judge is None:
                executor.judge = judge  # the searches reuse the baselines the rooms were measured from
        rooms = isinstance(judge, RoomJudge)  # a judge that measures no rooms leaves the order as it is
    if executor is None and len(todo) > 1:
        # Several regions at once, one judge for all: see ks_inductor.warm.parallel.
        from ks_inductor.warm.parallel import default_parallel_regions

        n = config.parallel_regions or default_parallel_regions(fp, judge)
        if n > 1:
            executor = RegionThreads(judge, n)
            # Each search keeps time for its final judgments assuming the searches beside it do the same at once.
            config = replace(config, parallel_regions=min(n, len(todo)))
    if rooms:
        # Each region's room is measured beside the searches: a region's search starts once its own room is known
        # (none where the room settles it), the most room first among the regions whose rooms are known. The rooms
        # are stored from the loop that hands out regions, beside the searches' own writes.
        left = None if total_time_s is None else total_time_s - (time.perf_counter() - t0)
        store = LockedStore(store)
        queue = RegionQueue(todo, judge, store, fp, at, config.time_limit_s,
                            None if left is None else time.monotonic() + left, console,
                            idle=executor.workers if executor is not None else 1)
    gpu = _gpu_sampler(fp, executor, todo)
    prefetch = _start_prefetch(todo, config, judge, executor, total_time_s, t0, queue.passed)
    if executor is not None:
        if gpu is not None:
            executor.gpu = gpu
        try:
            deadline = None if total_time_s is None else time.time() + total_time_s - (time.perf_counter() - t0)
            executor.run(queue, config, store, deadline,
                         lambda item, outcome: apply_outcome(item, outcome, store, fp, console), console)
        finally:
            summary.wall_s = time.perf_counter() - t0
            _end_gpu_sampler(gpu, summary)
            if prefetch is not None:
                prefetch.close()
            if made is not None:
                made.close()
        return summary
    try:
        while True:
            left = None if total_time_s is None else total_time_s - (time.perf_counter() - t0)
            nxt = queue.take(idle=1)
            if nxt is None:
                if queue.exhausted:
                    break
                # The next region's room is still being measured.
                if not queue.wait(None if left is None else max(0.0, left)):
                    for item in queue.abandon():
                        item.status, item.note = "not-run", (f"the whole-run limit of {total_time_s:g} s was "
                                                             "reached before this region's room was measured")
                    break
                continue
            item, problem = nxt
            if left is not None and left <= 0:
                item.status, item.note = "not-run", f"the whole-run limit of {total_time_s:g} s was reached"
                continue
            n = summary.items.index(item) + 1
            console.print(f"[{n}/{len(distinct)}] {problem.name} {item.key[:12]} ({item.signature}): evolving")
            t1 = time.perf_counter()
            try:
                if judge is None:
                    judge = search_judge(config)
                    # The judge's start is part of the run: the region gets what is left after it.
                    left = None if total_time_s is None else total_time_s - (time.perf_counter() - t0)
                outcome = evolve_region(problem, region_config(config, left, item.time_limit_s), store, judge,
                                        progress=True)
            except KeyboardInterrupt:
                item.status, item.note = "failed", "interrupted"
                raise
            apply_outcome(item, outcome, store, fp, console)
            item.wall_s = time.perf_counter() - t1
    finally:
        summary.wall_s = time.perf_counter() - t0
        _end_gpu_sampler(gpu, summary)
        if prefetch is not None:
            prefetch.close()
        if gpu is not None and summary.gpu_util:
            console.print(summary.gpu_text())
        if own_judge and judge is not None:
            judge.close()
    return summary


def _start_prefetch(todo: list[tuple[WarmItem, Problem]], config: EvolveConfig, judge: SearchJudge | None,
                    executor: RegionExecutor | None, total_time_s: float | None, t0: float,
                    passed: Callable[[str], bool] | None = None) -> CodegenPrefetch | None:
    """Inductor's code generation for every region to search here, started in the background (see
    :mod:`ks_inductor.warm.prefetch`), or None for searches elsewhere (a Ray cluster: its workers are other
    processes, whose memo this one cannot fill). ``passed(key)``: the region's search started, or its room settled
    it, so its generation is not started ahead."""
    from ks_inductor.warm.prefetch import start_prefetch

    if executor is not None and not executor.local:
        return None
    # The searches that start at once generate their own plans; the background takes the next ones, rather than
    # wait behind a search's generation of the same region while later regions start.
    first = executor.workers if executor is not None else 1
    deadline = None if total_time_s is None else time.monotonic() + total_time_s - (time.perf_counter() - t0)
    return start_prefetch([p for _, p in todo[first:]], config, _judge_device(judge, config), deadline, passed)


def _judge_device(judge: SearchJudge | None, config: EvolveConfig) -> str | None:
    """The device the searches' judge runs candidates on ("cuda", "cpu" for the interpreter): the target of
    Inductor's code generation. None where it cannot be told."""
    if judge is not None:
        return judge.backend.device
    from ks_inductor.judge.backends import detect_backend

    try:
        return detect_backend(config.backend).device
    except Exception as e:  # noqa: BLE001 - the searches meet the same error and report it
        log.debug("no judge backend for prefetching: %s", e)
        return None


def _gpu_sampler(fp: EnvFingerprint, executor: RegionExecutor | None, todo: list[Any]) -> GpuSampler | None:
    """A started :class:`ks_inductor.gpu_util.GpuSampler` for a search on this host's GPUs, else None: nothing to
    evolve, an untimed backend (no GPU work worth showing), or a Ray cluster (its GPUs are not all here)."""
    if not todo or not fp.timed or (executor is not None and not executor.local):
        return None
    from ks_inductor.gpu_util import GpuSampler

    gpu = GpuSampler()
    return gpu.start() if gpu.available else None


def _end_gpu_sampler(gpu: GpuSampler | None, summary: WarmSummary) -> None:
    if gpu is None:
        return
    gpu.stop()
    summary.gpu_util, summary.gpu_util_source = gpu.summary(), gpu.source


def apply_outcome(item: WarmItem, outcome: dict[str, Any], store: SearchStore, fp: EnvFingerprint,
                  console: Any = None) -> None:
    """Read one region's outcome (:func:`evolve_region`'s JSON) into ``item``; a stored verified kernel makes it
    ``found`` and clears the key's recorded miss."""
    status = outcome.get("status", "failed")
    item.note = outcome.get("note", "")
    if outcome.get("wall_s") is not None:
        item.wall_s = float(outcome["wall_s"])
    w = outcome.get("worker")
    if w:
        item.worker = f"{w.get('node', '?')} pid {w.get('pid', '?')}"
    if status != "done":
        item.status = status
        if status == "no-kernel" and console is not None:
            console.print(f"  [yellow]no kernel[/]: {item.note}")
        return
    res = outcome.get("summary") or {}
    item.judged, item.accepted = int(res.get("judged", 0)), int(res.get("accepted", 0))
    best = store.lookup(item.key, fp)
    if best is not None:
        item.status, item.best_speedup, item.timed = "found", best.speedup_inductor, best.timed
        _clear_miss(store, item.key)
    else:
        item.status = "no-kernel"
        item.note = item.note or res.get("why") or "the search stored no verified kernel"
        if console is not None:
            console.print(f"  [yellow]no kernel[/]: {item.note}")


def _clear_miss(store: SearchStore, key: str) -> None:
    try:
        store.clear_miss(key)
    except Exception as e:  # noqa: BLE001 - bookkeeping only
        log.debug("clear_miss(%s): %s", key, e)
