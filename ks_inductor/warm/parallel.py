"""Several regions searched at once in this process: one thread per region in flight, all sharing one judge, whose
pool already spreads judgments over the local devices. A region's CPU-bound phases (seeds, compiles, checks) then
overlap another's timing, and every device gets work from whichever region has it queued.

Used by :func:`ks_inductor.warm.warm` as an executor, as the Ray executor is: ``run(todo, config, store, deadline,
apply, console)`` hands each region's outcome (:func:`ks_inductor.warm.region.evolve_region`'s JSON) to ``apply``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from ks_core.fingerprint import EnvFingerprint
from ks_inductor.contracts import Apply, RegionSource, SearchJudge, SearchStore

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig
    from ks_inductor.gpu_util import GpuSampler

# Regions in flight per local GPU when the config says nothing. A judgment holds its device alone for a small part
# of its wall time (the timing; its worker's start, compile and checks overlap others), and a region's search keeps
# only a few children in flight and pauses between generations, so one region per GPU leaves the GPU mostly idle.
REGIONS_PER_GPU = 3


def default_parallel_regions(fp: EnvFingerprint, judge: SearchJudge | None = None) -> int:
    """Regions in flight when the config says nothing: ``REGIONS_PER_GPU`` per local device, and two on the CPU (the
    interpreter judge's workers are processes of their own, so a second region keeps the cores busy while the
    first one's loop waits on its verdicts)."""
    if not fp.timed:
        return 2
    if judge is not None and judge.device_count:
        return REGIONS_PER_GPU * judge.device_count
    import torch

    return REGIONS_PER_GPU * max(1, torch.cuda.device_count())


class LockedStore:
    """The kernel cache behind one lock: the region searches write their steps and verdicts from several threads,
    and a store's connection is not meant to be shared by threads at once."""

    def __init__(self, store: SearchStore) -> None:
        self._store = store
        self.lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return attr(*args, **kwargs)

        return locked


class _Region:
    """One region's progress, as the evolver reports it (``evolve_problem(progress=...)``)."""

    def __init__(self, board: _Board, name: str, key: str) -> None:
        self.board, self.name, self.key = board, name, key
        self.submitted = 0
        self.judged = 0
        self.best = "-"
        self.t0 = time.monotonic()

    def advance(self) -> None:
        self.submitted += 1

    def done(self) -> None:
        self.judged += 1
        self.board.judgments += 1

    def set_best(self, text: str) -> None:
        self.best = text


class _Board:
    """One live view of every region in flight: judgments per minute over all of them, each GPU's utilisation (when
    ``gpu``, a :class:`ks_inductor.gpu_util.GpuSampler`, samples it), and each region's count, best so far and
    time."""

    def __init__(self, total: int, console: Any, workers: int, gpu: Any = None) -> None:
        self.total, self.console, self.workers, self.gpu = total, console, workers, gpu
        self.running: dict[str, _Region] = {}
        self.finished = 0
        self.settled = 0  # regions whose room settled them: done without a search
        self.judgments = 0
        self.t0 = time.monotonic()
        self.live: Any = None

    def __enter__(self) -> _Board:
        from rich.live import Live

        self.live = Live(console=self.console, get_renderable=self.render, refresh_per_second=2, transient=True)
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.stop()

    def rate(self) -> float:
        minutes = (time.monotonic() - self.t0) / 60
        return self.judgments / minutes if minutes > 0 else 0.0

    def render(self) -> Any:
        from rich.table import Table

        t = Table(title=f"warm: {self.finished + self.settled}/{self.total} regions done, {len(self.running)} in flight "
                        f"(up to {self.workers}), {self.judgments} judgments, {self.rate():.0f}/min, "
                        f"{time.monotonic() - self.t0:.0f}s{self._gpu_now()}", title_justify="left")
        for col in ("region", "key", "judged", "in flight", "best", "s"):
            t.add_column(col, overflow="fold")
        for r in list(self.running.values()):
            t.add_row(r.name, r.key[:12], str(r.judged), str(r.submitted - r.judged), r.best,
                      f"{time.monotonic() - r.t0:.0f}")
        return t

    def _gpu_now(self) -> str:
        text = self.gpu.text(latest=True) if self.gpu is not None else ""
        return f", {text}" if text else ""

    def start(self, item: Any) -> _Region:
        region = self.running[item.key] = _Region(self, item.name, item.key)
        return region

    def end(self, item: Any, outcome: dict[str, Any]) -> None:
        self.running.pop(item.key, None)
        self.finished += 1
        self.console.print(f"  {item.name} {item.key[:12]}: {item.status} ({item.judged} judged, "
                           f"{outcome.get('wall_s', 0.0):.0f}s)")


class RegionThreads:
    """Searches up to ``workers`` regions at once with one shared judge (made for the run when none is given): a
    :class:`ks_inductor.contracts.RegionExecutor` that runs here."""

    local = True

    def __init__(self, judge: SearchJudge | None = None, workers: int = 2) -> None:
        self.judge = judge
        self.workers = max(1, workers)
        self.judgments = 0
        self.rate = 0.0  # judgments per minute over the run, once it ended
        self.gpu: GpuSampler | None = None  # a started sampler, set by warm() on a host with GPUs to show

    def fingerprint(self, config: EvolveConfig) -> EnvFingerprint:
        from ks_inductor.judge.backends import current_fingerprint

        return self.judge.fingerprint if self.judge is not None else current_fingerprint(config.backend)

    def run(self, regions: RegionSource, config: EvolveConfig, store: SearchStore, deadline: float | None,
            apply: Apply, console: Any) -> None:
        """Search every region ``regions`` hands out, ``workers`` at a time; ``deadline`` (``time.time()``) bounds
        the whole run: each region's search gets at most what is left of it when it starts, and a region that does
        not start in time is ``not-run``. Regions start as their rooms arrive (the loop waits on the rooms and the
        searches at once, so a free thread takes a region the moment its room is known)."""
        from ks_inductor.evolve.evolver import search_judge
        from ks_inductor.warm.region import evolve_region, region_config

        queue = regions
        if queue.exhausted:
            return
        own = self.judge is None
        judge = self.judge or search_judge(config)
        locked = store if isinstance(store, LockedStore) else LockedStore(store)
        board = _Board(queue.total, console, self.workers, self.gpu)

        def one(item: Any, problem: Problem) -> dict[str, Any]:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                return {"status": "not-run", "note": "the whole-run limit was reached before this region started"}
            t1 = time.monotonic()
            outcome = evolve_region(problem, region_config(config, left, item.time_limit_s),
                                    locked, judge, progress=board.start(item))
            outcome["wall_s"] = time.monotonic() - t1
            return outcome

        def finish(item: Any, outcome: dict[str, Any]) -> None:
            with locked.lock:
                apply(item, outcome)
            board.end(item, outcome)

        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ks-warm-region")
        futures: dict[Future[dict[str, Any]], Any] = {}
        searched = 0
        finished = False
        try:
            with board:
                while True:
                    # Rooms that arrived are read (and stored) whether or not a thread is free, so that the next
                    # ones are asked for meanwhile.
                    with locked.lock:
                        queue.poll(idle=self.workers - len(futures))
                        board.settled = len(queue.settled)
                    while len(futures) < self.workers and (nxt := queue.take(self.workers - len(futures))):
                        futures[pool.submit(one, *nxt)] = nxt[0]
                        searched += 1
                    if not futures and queue.exhausted:
                        break
                    # With no search in flight, only a room can end the wait: not past the whole run's limit.
                    timeout = None if futures or deadline is None else max(0.0, deadline - time.time())
                    done, _ = wait(set(futures) | set(queue.waiting()), timeout=timeout,
                                   return_when=FIRST_COMPLETED)
                    if not done and not futures:
                        for item in queue.abandon():
                            finish(item, {"status": "not-run",
                                          "note": "the whole-run limit was reached before this region's room "
                                                  "was measured"})
                        break
                    for fut in done:
                        item = futures.pop(fut, None)
                        if item is None:
                            continue  # a room: the next pass takes its region
                        try:
                            outcome = fut.result()
                        except Exception as e:  # noqa: BLE001 - one region failing must not stop the others
                            outcome = {"status": "failed", "note": f"{type(e).__name__}: {e}"[:300]}
                        finish(item, outcome)
            finished = True
        finally:
            self.judgments, self.rate = board.judgments, board.rate()
            if finished:
                pool.shutdown(wait=True)
                if own:
                    judge.close()
            else:
                # Interrupted: the judge goes first, so that the searches still running end at their next verdict
                # rather than at their time limits.
                if own:
                    judge.close()
                pool.shutdown(wait=False, cancel_futures=True)
        gpu = self.gpu.text() if self.gpu is not None else ""
        console.print(f"searched {searched} regions, up to {self.workers} at once: {self.judgments} judgments, "
                      f"{self.rate:.0f} per minute" + (f"; average utilisation {gpu}" if gpu else ""))

    def close(self) -> None:
        """Nothing to release: the judge this executor made was closed at the end of its run."""
