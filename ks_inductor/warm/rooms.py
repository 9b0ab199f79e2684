"""The order a warm's searches start in, and each region's room, measured beside the searches.

The judge measures each region's baselines and floor once (:meth:`ks_inductor.judge.Judge.submit_room`) and keeps
them for the region's search, which reuses them. A warm asks for the rooms a few at a time and starts a region's
search as soon as its own room is known, while the rooms after it are still being measured: the searches overlap
the room jobs instead of waiting for all of them. A settled region (its faster baseline within 10% of its floor) is
not searched: the backend serves that baseline. Among the regions whose rooms are known, the one with the most time
above its floor starts first, each with a share of the time limit that follows its room
(:func:`ks_inductor.judge.room.time_share`); a region whose room could not be measured is searched after those
with one, with its whole limit.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any

from ks_core.fingerprint import EnvFingerprint
from ks_inductor.contracts import Region, RoomJudge, SearchStore
from ks_inductor.judge.room import SETTLE_AT, Room, time_share

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig

log = logging.getLogger(__name__)

# Rooms in flight per device of the judge. A room is one baselines job: Inductor's compile, then the timing alone on
# the device. Two keep the device busy (one timing while the next compiles); more would only take the judge's threads
# from the judgments of the searches already running.
ROOMS_PER_DEVICE = 2


def settle_threshold(config: EvolveConfig, fp: EnvFingerprint) -> float | None:
    """The fraction of the floor that settles a region for this run; None where no room is measured (the
    interpreter, unless the config asks)."""
    if config.settle_at is not None:
        return float(config.settle_at)
    return SETTLE_AT if fp.timed else None


def place(item: Any, room: Room, at: float, time_limit_s: float | None) -> float | None:
    """Read ``room`` into a warm ``item``: None where it settles the region (the item is marked so), else the
    region's place in the order (larger first: its time above the floor, -1 without a measured baseline); the item
    gets its room and, under a time limit, its share of it (``item.time_limit_s``)."""
    if room.settled(at):
        settle(item, room)
        return None
    item.room = room.to_json()
    if time_limit_s is not None:
        # A run that settles nothing by its rooms (a pack's: ``settle_at`` infinite) lets no room cut its time.
        item.time_limit_s = time_limit_s * (time_share(room) if math.isfinite(at) else 1.0)
    return room.weight if room.best_ms is not None else -1.0


def plan(todo: list[Region], rooms: dict[str, Room], at: float,
         time_limit_s: float | None) -> tuple[list[Region], list[tuple[Any, Room]]]:
    """With every room known: (the regions to search, most time above the floor first; the settled ones with their
    rooms), each item read as :func:`place` reads it. A region without a room keeps its place after those with one."""
    search: list[tuple[float, int, Any, Any]] = []
    settled: list[tuple[Any, Room]] = []
    for n, (item, problem) in enumerate(todo):
        room = rooms.get(problem.key)
        weight = -1.0 if room is None else place(item, room, at, time_limit_s)
        if weight is None:
            settled.append((item, room))
            continue
        search.append((-weight, n, item, problem))
    search.sort(key=lambda t: (t[0], t[1]))
    return [(item, problem) for _, _, item, problem in search], settled


def settle(item: Any, room: Room) -> None:
    """Mark a warm item settled: no search, the backend serves its faster baseline."""
    item.status = "settled"
    item.room = room.to_json()
    item.note = f"settled, no search: {room.summary()}"
    item.wall_s = 0.0


class RegionQueue:
    """A warm's regions in the order their searches start. Without a judge, all ready at once in the order given.
    With one (and ``at``, the settle threshold), each region is ready once its own room is known: its room is asked
    of ``judge.submit_room`` in the order given, ``in_flight`` at a time (more while searches wait for a region,
    ``idle``), stored (``store.put_room``) and shown on ``console``; a settled region leaves the queue
    (``settled``), and :meth:`take` hands out the ready region with the most time above its floor. ``deadline``
    (``time.monotonic()``) bounds each room's measurement.

    One thread takes regions and waits on rooms (the executor's loop); :meth:`passed`, a set lookup, is safe from
    any (the code generation ahead asks it)."""

    def __init__(self, todo: list[Region], judge: RoomJudge | None = None, store: SearchStore | None = None,
                 fp: EnvFingerprint | None = None, at: float | None = None, time_limit_s: float | None = None, deadline: float | None = None,
                 console: Any = None, in_flight: int | None = None, idle: int = 0) -> None:
        self.total = len(todo)
        self.settled: list[tuple[Any, Room]] = []
        self._judge, self._store, self._fp, self._console = judge, store, fp, console
        self._at, self._limit, self._deadline = at, time_limit_s, deadline
        self._ready: list[tuple[float, int, Any, Any]] = []
        self._waiting: dict[Future[Room], tuple[int, Any, Any]] = {}
        self._unsent: deque[tuple[int, Any, Any]] = deque()
        self._passed: set[str] = set()  # keys taken for a search or settled
        measured = judge is not None and at is not None
        for n, (item, problem) in enumerate(todo):
            if measured:
                self._unsent.append((n, item, problem))
            else:
                heapq.heappush(self._ready, (0.0, n, item, problem))
        if measured:
            devices = judge.device_count or 1
            self._in_flight = max(1, in_flight or ROOMS_PER_DEVICE * int(devices))
            self._send(idle)

    @property
    def measured(self) -> bool:
        """Whether regions wait for their rooms."""
        return self._judge is not None and self._at is not None

    @property
    def exhausted(self) -> bool:
        """No region left to hand out, now or later."""
        return not self._ready and not self._waiting and not self._unsent

    def waiting(self) -> list[Future[Room]]:
        """The rooms being measured, for an executor to wait on beside its searches."""
        return list(self._waiting)

    def passed(self, key: str) -> bool:
        """Whether the region ``key`` was handed out for its search or settled: its code generation is no longer
        worth starting ahead."""
        return key in self._passed

    def take(self, idle: int = 0) -> Region | None:
        """The ready region to search next (``(item, problem)``), or None where none is ready now; never blocks.
        ``idle``: as for :meth:`poll`."""
        self.poll(idle)
        if not self._ready:
            return None
        _, _, item, problem = heapq.heappop(self._ready)
        self._passed.add(problem.key)
        return item, problem

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a room arrives; False where ``timeout`` seconds passed first."""
        if not self._waiting:
            return True
        done, _ = wait(list(self._waiting), timeout=timeout, return_when=FIRST_COMPLETED)
        return bool(done)

    def abandon(self) -> list[Any]:
        """Give up on the regions whose rooms have not arrived (the whole run's limit was reached): their items,
        for the caller to report; rooms not yet started are cancelled."""
        left = [(n, item) for n, item, _ in self._unsent] + [(n, item) for n, item, _ in self._waiting.values()]
        for fut in self._waiting:
            fut.cancel()
        self._unsent.clear()
        self._waiting.clear()
        return [item for _, item in sorted(left, key=lambda t: t[0])]

    def _send(self, idle: int = 0) -> None:
        while self._unsent and len(self._waiting) < self._in_flight + idle:
            n, item, problem = self._unsent.popleft()
            try:
                fut = self._judge.submit_room(problem, self._deadline)
            except Exception as e:  # noqa: BLE001 - the region is searched without a room
                fut = Future()
                fut.set_exception(e)
            self._waiting[fut] = (n, item, problem)

    def poll(self, idle: int = 0) -> None:
        """Read every room that arrived, and ask for the next ones in their place; never blocks. ``idle``: searches
        the caller could start now and has no region for; as many more rooms are asked for, since no judgment of
        theirs waits behind them yet (at a warm's start, every search)."""
        if not self.measured:
            return
        for fut in [f for f in self._waiting if f.done()]:
            n, item, problem = self._waiting.pop(fut)
            self._arrived(n, item, problem, fut)
        self._send(idle)

    def _arrived(self, n: int, item: Any, problem: Problem, fut: Future[Room]) -> None:
        try:
            room = fut.result()
        except Exception as e:  # noqa: BLE001 - the region is searched without a room
            room = Room(problem.key, note=f"{type(e).__name__}: {e}"[:300])
        try:
            self._store.put_room(problem.key, self._fp.id, room.to_json())
        except Exception as e:  # noqa: BLE001 - a measurement the next run takes again
            log.warning("could not store the room of %s: %s", problem.name, e)
        if self._console is not None:
            self._console.print(f"  room of {problem.name} {problem.key[:12]}: {room.summary()}")
        weight = place(item, room, self._at, self._limit)
        if weight is None:
            self.settled.append((item, room))
            self._passed.add(problem.key)
            return
        heapq.heappush(self._ready, (-weight, n, item, problem))

