"""A warm's first phase: every region's room, measured before any search, so that the searches go where the room is.

The judge measures each region's baselines and floor once (:meth:`ks_inductor.judge.Judge.room`; references in
parallel, the baselines' timing one region at a time per device) and keeps them for the region's search, which
reuses them. A settled region (its faster baseline within 10% of its floor) is not searched: the backend serves
that baseline. The others are searched in the order of the time they spend above their floor, most first, each
with a share of the time limit that follows its room (:func:`ks_inductor.judge.room.time_share`).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from ks_inductor.judge.room import SETTLE_AT, Room, time_share

log = logging.getLogger(__name__)


def settle_threshold(config: Any, fp: Any) -> float | None:
    """The fraction of the floor that settles a region for this run; None where no room is measured (the
    interpreter, unless the config asks)."""
    at = getattr(config, "settle_at", None)
    if at is not None:
        return float(at)
    return SETTLE_AT if getattr(fp, "timed", False) else None


def measure_rooms(todo: list[tuple[Any, Any]], judge: Any, store: Any, fp: Any,
                  deadline: float | None, console: Any = None) -> dict[str, Room]:
    """Each region's room by key, measured by ``judge`` at once for all and stored; a region whose measurement
    failed has a room with only its note. ``deadline``: ``time.monotonic()``."""
    futures: dict[str, Future[Room]] = {p.key: judge.submit_room(p, deadline) for _, p in todo}
    rooms: dict[str, Room] = {}
    for _, problem in todo:
        try:
            room = futures[problem.key].result()
        except Exception as e:  # noqa: BLE001 - the region is searched without a room, as before rooms existed
            room = Room(problem.key, note=f"{type(e).__name__}: {e}"[:300])
        rooms[problem.key] = room
        try:
            store.put_room(problem.key, fp.id, room.to_json())
        except Exception as e:  # noqa: BLE001 - a measurement the next run takes again
            log.warning("could not store the room of %s: %s", problem.name, e)
        if console is not None:
            console.print(f"  room of {problem.name} {problem.key[:12]}: {room.summary()}")
    return rooms


def plan(todo: list[tuple[Any, Any]], rooms: dict[str, Room], at: float,
         time_limit_s: float | None) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Room]]]:
    """(the regions to search, most time above the floor first; the settled ones with their rooms). Each item to
    search gets its room and, under a time limit, its share of it (``item.time_limit_s``)."""
    search: list[tuple[float, int, Any, Any]] = []
    settled: list[tuple[Any, Room]] = []
    for n, (item, problem) in enumerate(todo):
        room = rooms.get(problem.key)
        if room is not None and room.settled(at):
            settled.append((item, room))
            continue
        if room is not None:
            item.room = room.to_json()
            if time_limit_s is not None:
                item.time_limit_s = time_limit_s * time_share(room)
        # Regions without a measured baseline keep their order after those with one.
        weight = room.weight if room is not None and room.best_ms is not None else -1.0
        search.append((-weight, n, item, problem))
    search.sort(key=lambda t: (t[0], t[1]))
    return [(item, problem) for _, _, item, problem in search], settled


def settle(item: Any, room: Room) -> None:
    """Mark a warm item settled: no search, the backend serves its faster baseline."""
    item.status = "settled"
    item.room = room.to_json()
    item.note = f"settled, no search: {room.summary()}"
    item.wall_s = 0.0
