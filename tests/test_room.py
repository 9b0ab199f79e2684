"""A region's room: the judge measures eager's and Inductor's times and the floor (bytes at the measured copy rate,
FLOPs at the measured matmul rate), the search settles a region whose best baseline is near its floor and spends
nothing there, and the room is stored where explain and the backend read it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.judge.room import Room, floor_ms, time_share
from ks_inductor.problem_tracing import problem_from_source

ADD = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x + y


def get_inputs():
    return [torch.randn(256, 1024), torch.randn(256, 1024)]


def get_init_inputs():
    return []
'''

MM = ADD.replace("return x + y", "return x @ y").replace("torch.randn(256, 1024), torch.randn(256, 1024)",
                                                         "torch.randn(64, 96), torch.randn(96, 80)")


@pytest.fixture(scope="module")
def judge():
    with Judge(JudgeConfig.for_search(backend="triton-interpret", trials=2)) as j:
        yield j


def test_the_judge_measures_both_baselines_and_the_floor(judge) -> None:
    problem = problem_from_source(ADD, name="add")
    room = judge.room(problem)
    assert room.eager_ms and room.inductor_ms and room.bandwidth and room.bandwidth > 1e8
    assert room.bound == "memory" and room.flops_rate is None
    # Three fp32 tensors of 256 x 1024 cross memory once each.
    assert room.bytes_moved == 3 * 256 * 1024 * 4
    # The floor holds one launch of a minimal kernel, timed beside the copy rate (host clock on the interpreter).
    assert room.launch_ms and 0 < room.launch_ms < 1.0
    assert room.floor_ms == pytest.approx(room.bytes_moved / room.bandwidth * 1e3 + room.launch_ms)
    assert f"{room.launch_ms:.2g} ms launch" in room.summary()
    assert room.best in ("eager", "inductor") and room.fraction == pytest.approx(room.floor_ms / room.best_ms)
    # Measured once per problem: asking again reads the same baselines.
    assert judge.room(problem).eager_ms == room.eager_ms


def test_a_matmul_region_gets_a_flop_rate_and_a_compute_floor_where_flops_bind() -> None:
    problem = problem_from_source(MM, name="mm")
    with Judge(JudgeConfig.for_search(backend="triton-interpret", trials=1)) as j:
        room = j.room(problem)
    assert room.flops_rate and room.flops_rate > 1e6 and room.dtype == "float32"
    assert room.flops == 2 * 64 * 96 * 80
    expect, bound = floor_ms(problem, room.bandwidth, room.flops_rate, room.launch_ms)
    assert room.floor_ms == pytest.approx(expect) and room.bound == bound


def test_the_rule_reads_the_same_way_everywhere() -> None:
    near = Room("k", floor_ms=0.95, eager_ms=1.0, inductor_ms=1.2)
    far = Room("k", floor_ms=0.2, eager_ms=1.3, inductor_ms=1.0)
    assert near.settled() and near.weight == pytest.approx(0.05) and near.best == "eager" and near.serves_eager
    assert not far.settled() and far.weight == pytest.approx(0.8) and far.best == "inductor"
    assert not far.serves_eager  # eager is the slower one
    # Eager served only past the margin: a 3% lead is a tie.
    assert not Room("k", eager_ms=1.0, inductor_ms=1.03).serves_eager
    assert Room.from_json(near.to_json()) == near
    assert "settled" in near.summary() and "room" in far.summary()
    # No floor (no copy rate measured): never settled, the whole time is its claim.
    assert not Room("k", eager_ms=1.0, inductor_ms=2.0).settled()


class _Counts:
    """A problem's counts, as the floor reads them."""

    def __init__(self, bytes_moved: int, flops: int = 0, ops: tuple[str, ...] = ("add",)) -> None:
        self.bytes_moved, self.flops, self.op_summary = bytes_moved, flops, dict.fromkeys(ops, 1)


def test_the_floor_adds_one_launch_and_a_small_region_settles_by_it() -> None:
    small = _Counts(bytes_moved=3 * 2**20)  # 3 MiB at 3 TB/s: about 1 us
    bare, bound = floor_ms(small, 3e12, None)
    assert bound == "memory" and bare == pytest.approx(3 * 2**20 / 3e12 * 1e3)
    with_launch, _ = floor_ms(small, 3e12, None, 0.003)
    assert with_launch == pytest.approx(bare + 0.003)
    # A compute-bound floor gets the same single launch on top of the FLOPs' time.
    mm = _Counts(bytes_moved=2**20, flops=10**9, ops=("mm",))
    ms, bound = floor_ms(mm, 3e12, 1e12, 0.003)
    assert bound == "compute" and ms == pytest.approx(1.0 + 0.003)
    # No copy rate, no floor, whatever the launch.
    assert floor_ms(small, None, None, 0.003) == (None, "")
    # A 4.4 us baseline of a 1 us region: far from the bandwidth alone, within 10% of one launch more.
    assert not Room("k", floor_ms=bare, eager_ms=0.0044).settled()
    assert Room("k", floor_ms=with_launch, launch_ms=0.003, eager_ms=0.0044).settled()


def test_a_room_stored_without_a_launch_term_still_decodes(tmp_path) -> None:
    room = Room("k", floor_ms=0.01, bound="memory", bandwidth=1e12, launch_ms=0.004, eager_ms=0.02, inductor_ms=0.03)
    assert Room.from_json(room.to_json()) == room
    older = {k: v for k, v in room.to_json().items() if k != "launch_ms"}
    decoded = Room.from_json(older)
    assert decoded.launch_ms is None and decoded.floor_ms == 0.01 and decoded.fraction == pytest.approx(0.5)
    assert "launch" not in decoded.summary()
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    store.put_room("a", "fp", room.to_json())
    store.put_room("b", "fp", older)
    assert Room.from_json(store.room("a", "fp")).launch_ms == 0.004
    assert Room.from_json(store.room("b", "fp")) == decoded
    store.close()


def test_a_settled_region_is_not_searched_and_its_room_is_stored(judge, tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    # Any measured fraction settles at 0: the search must stop before judging a candidate.
    summary = evolve_problem(problem, EvolveConfig(budget=4, settle_at=0.0, inductor_seeds=False), store,
                             judge=judge, progress=False)
    assert summary.stop_reason == "settled" and summary.judged == 0 and summary.best is None
    assert summary.why.startswith("settled, no search:") and "floor" in summary.why
    stored = store.room(problem.key, judge.fingerprint.id)
    assert stored is not None and stored["eager_ms"] == summary.room["eager_ms"] and stored["floor_ms"] > 0
    assert store.last_why(problem.key) == summary.why
    # A threshold no baseline reaches: the search runs, and its summary carries the same measured room.
    searched = evolve_problem(problem, EvolveConfig(budget=2, settle_at=1e9, inductor_seeds=False), store,
                              judge=judge, progress=False)
    assert searched.stop_reason != "settled" and searched.judged == 2
    assert searched.room is not None and searched.room["eager_ms"] == summary.room["eager_ms"]
    store.close()


def test_the_interpreter_measures_no_room_unless_asked(judge, tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    summary = evolve_problem(problem, EvolveConfig(budget=1, inductor_seeds=False), store, judge=judge,
                             progress=False)
    assert summary.room is None and summary.judged == 1
    assert store.room(problem.key, judge.fingerprint.id) is None
    store.close()


class _Block(__import__("torch").nn.Module):
    """One region: a normalization with its gate."""

    def forward(self, x, w):
        import torch

        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return torch.nn.functional.silu(h) * h


def _room(key: str, eager_ms: float, inductor_ms: float) -> dict:
    return Room(key, floor_ms=0.01, bound="memory", bandwidth=1e10, eager_ms=eager_ms,
                inductor_ms=inductor_ms).to_json()


def test_the_backend_serves_eager_where_its_room_says_eager_is_faster(tmp_path, monkeypatch) -> None:
    import torch
    import torch._dynamo

    import ks_inductor
    from ks_inductor.compiler.backend import (
        EAGER,
        clear_reports,
        compile_reports,
        current_fingerprint,
        forget_stores,
    )

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    db = f"sqlite:///{tmp_path}/k.db"
    model, x, w = _Block(), torch.randn(8, 64), torch.randn(64)
    keys = [r.key for r in ks_inductor.explain(model, x, w, db=db).regions if r.key]
    assert len(keys) == 1
    fp = current_fingerprint()

    def served_with(eager_ms: float, inductor_ms: float):
        store = KernelStore(db)
        store.put_room(keys[0], fp.id, _room(keys[0], eager_ms, inductor_ms))
        store.close()
        forget_stores()
        torch._dynamo.reset()
        clear_reports()
        compiled = torch.compile(model, backend="kernelsmith",
                                 options={"kernelsmith.db": db, "kernelsmith.graph_guard": "off"})
        with torch.no_grad():
            got = compiled(x, w)
        torch.testing.assert_close(got, model(x, w))
        return next(r for r in ks_inductor.served().regions if r.key), compile_reports()[-1]

    try:
        row, report = served_with(eager_ms=1.0, inductor_ms=1.02)  # a tie: Inductor's code stays
        assert row.served == "inductor" and report.swapped == 0 and report.eager == 0
        row, report = served_with(eager_ms=1.0, inductor_ms=1.5)  # eager 1.5x faster
        assert row.served == "eager" and row.status == EAGER and "1.50x Inductor" in row.why
        assert report.eager == 1 and report.swapped == 1
        # explain shows the region's stored room
        text = str(ks_inductor.explain(model, x, w, db=db))
        assert "eager at" in text and "% of floor" in text
    finally:
        torch._dynamo.reset()
        clear_reports()
        forget_stores()


def _searches(monkeypatch, first: Any = None) -> list[tuple[str, float]]:
    """Every search a warm starts, as (problem key, start time); ``first`` (an event) is set as one starts."""
    import ks_inductor.evolve as E

    started: list[tuple[str, float]] = []
    original = E.evolve_problem

    def noted(problem, *args, **kwargs):
        started.append((problem.key, time.monotonic()))
        if first is not None:
            first.set()
        return original(problem, *args, **kwargs)

    monkeypatch.setattr(E, "evolve_problem", noted)
    return started


def test_warm_skips_the_settled_regions_and_shares_time_by_room(judge, tmp_path, monkeypatch) -> None:
    from rich.console import Console

    from ks_inductor.warm import warm

    problems = [small_problem("rmsnorm_bf16"), problem_from_source(ADD, name="add")]
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    quiet = Console(file=open(tmp_path / "log.txt", "w"), width=200)
    started = _searches(monkeypatch)
    summary = warm(problems, store, EvolveConfig(budget=1, settle_at=0.0, inductor_seeds=False), judge=judge,
                   console=quiet)
    assert [i.status for i in summary.items] == ["settled", "settled"] and summary.settled == 2
    assert started == []  # no search began for either
    assert all(i.judged == 0 and i.note.startswith("settled, no search:") for i in summary.items)
    for p in problems:
        assert store.room(p.key, judge.fingerprint.id)["floor_ms"] > 0
    assert "settled" in str(summary.to_json()) and "(settled)" in _text(summary.table())
    # Nothing settles: each region is searched with its room and its share of the time limit.
    summary = warm(problems, store, EvolveConfig(budget=1, settle_at=1e9, time_limit_s=100.0, inductor_seeds=False),
                   judge=judge, console=quiet)
    assert sorted(k for k, _ in started) == sorted(p.key for p in problems)
    for item in summary.items:
        assert item.status == "found" and item.room is not None
        assert item.time_limit_s == pytest.approx(100.0 * time_share(Room.from_json(item.room)))
    store.close()


# How long the last region's room is held waiting for a search to start before the test gives up on it.
HOLD_S = 60.0


@pytest.mark.parametrize("regions", [1, 2])
def test_a_warm_starts_searching_before_the_last_room_is_measured(judge, tmp_path, monkeypatch, regions) -> None:
    """The last region's room is held until a search has started: a warm that measured every room before its first
    search would wait here until the hold gives up. One region at a time and two at once alike."""
    import threading

    from rich.console import Console

    from ks_inductor.warm import warm

    problems = [problem_from_source(ADD, name="add"), problem_from_source(MM, name="mm")]
    last = problems[-1].key
    searching = threading.Event()
    started = _searches(monkeypatch, searching)
    held: dict[str, bool] = {}
    measured: dict[str, float] = {}
    room = judge.room

    def held_room(problem, deadline=None):
        if problem.key == last and "waited" not in held:
            held["waited"] = searching.wait(HOLD_S)
        got = room(problem, deadline)
        measured.setdefault(problem.key, time.monotonic())
        return got

    monkeypatch.setattr(judge, "room", held_room)
    quiet = Console(file=open(tmp_path / "log.txt", "w"), width=200)
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    summary = warm(problems, store, EvolveConfig(budget=1, settle_at=1e9, inductor_seeds=False,
                                                 parallel_regions=regions), judge=judge, console=quiet)
    assert held["waited"], "no search started while the last room was being measured"
    assert started[0][0] == problems[0].key and started[0][1] < measured[last]
    # Both regions were still searched with their rooms, and the rooms stored.
    assert [i.status for i in summary.items] == ["found", "found"], [(i.status, i.note) for i in summary.items]
    assert all(i.room is not None and i.room["floor_ms"] for i in summary.items)
    assert all(store.room(p.key, judge.fingerprint.id) is not None for p in problems)
    store.close()


def test_the_plan_searches_most_room_first_and_shares_time_by_room() -> None:
    from ks_inductor.warm.rooms import plan
    from ks_inductor.warm.run import WarmItem

    rooms = {"a": Room("a", floor_ms=0.5, eager_ms=0.6, inductor_ms=0.7),  # 83%: a little room, 0.1 ms of it
             "b": Room("b", floor_ms=1.0, eager_ms=5.0, inductor_ms=4.0),  # 25%: 3 ms above the floor
             "c": Room("c", floor_ms=1.0, eager_ms=1.05, inductor_ms=1.2),  # 95%: settled
             "d": Room("d", note="the reference failed")}  # no room measured: searched last, whole time
    todo = [(WarmItem(k, k, "model", ""), type("P", (), {"key": k})()) for k in "abcd"]
    order, settled = plan(todo, rooms, 0.9, 60.0)
    assert [p.key for _, p in order] == ["b", "a", "d"] and [i.key for i, _ in settled] == ["c"]
    limits = {i.key: i.time_limit_s for i, _ in order}
    assert limits["b"] == 60.0 and limits["d"] == 60.0
    assert limits["a"] == pytest.approx(60.0 * max(0.25, (1 - 0.5 / 0.6) / 0.5))


def test_the_queue_hands_out_regions_as_their_rooms_arrive(tmp_path) -> None:
    from concurrent.futures import Future

    from ks_inductor.warm.rooms import RegionQueue
    from ks_inductor.warm.run import WarmItem

    asked: dict[str, Future] = {}

    class Rooms:
        """Rooms the test hands back when it chooses: ``submit_room`` as the judge offers it."""

        device_count = 1

        def submit_room(self, problem, deadline=None):
            asked[problem.key] = Future()
            return asked[problem.key]

    def arrive(key: str, **times: float) -> None:
        asked[key].set_result(Room(key, floor_ms=1.0, **times))

    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    fp = type("F", (), {"id": "fp"})()
    todo = [(WarmItem(k, k, "model", ""), type("P", (), {"key": k, "name": k})()) for k in "abcde"]
    queue = RegionQueue(todo, Rooms(), store, fp, 0.9, 60.0, None, None, in_flight=2)
    assert list(asked) == ["a", "b"] and queue.take() is None and not queue.exhausted
    arrive("b", eager_ms=2.5)  # at 40% of its floor: searched as soon as it is known, with its whole limit
    item, problem = queue.take()
    assert problem.key == "b" and item.time_limit_s == 60.0 and item.room["floor_ms"] == 1.0
    assert queue.passed("b") and list(asked) == ["a", "b", "c"]  # the next room asked in its place
    arrive("a", eager_ms=1.02)  # settled: never handed out
    arrive("c", eager_ms=4.0)
    queue.poll()
    arrive("d", eager_ms=2.0)
    asked["e"].set_exception(RuntimeError("the reference failed"))
    # Among the rooms known, most time above the floor first; the one without a room last.
    assert [queue.take()[1].key for _ in range(3)] == ["c", "d", "e"]
    assert [i.key for i, _ in queue.settled] == ["a"] and todo[0][0].status == "settled" and queue.passed("a")
    assert queue.take() is None and queue.exhausted
    assert store.room("e", "fp")["note"].startswith("RuntimeError")
    # Rooms still out when the whole run's limit comes: their regions are handed back to be reported.
    late = RegionQueue(todo[:3], Rooms(), store, fp, 0.9, None, None, None, in_flight=1, idle=1)
    assert len(late.waiting()) == 2  # one more room asked for while a search has nothing to start
    assert not late.wait(0.01)
    assert [i.key for i in late.abandon()] == ["a", "b", "c"] and late.exhausted
    store.close()


def _text(table) -> str:
    from ks_inductor.compiler.served import render

    return render(table)


BIG = ADD.replace("torch.randn(256, 1024), torch.randn(256, 1024)", "torch.randn(4096, 4096), torch.randn(4096)")
OUT_BYTES = 4096 * 4096 * 4


def test_a_finished_search_leaves_no_gb_scale_reference_on_the_scratch_disk(judge, tmp_path) -> None:
    # 64 MiB of outputs a trial; two draws of two trials and three timing sets kept: over the threshold a shared judge
    # drops.
    problem = problem_from_source(BIG, name="big_add")
    judge.prepare(problem).result()
    held = judge.scratch_bytes()
    assert held >= 7 * OUT_BYTES
    judge.release(problem)
    assert judge.scratch_bytes() <= held - 7 * OUT_BYTES
    # Judged again later, the reference is computed again: nothing refers to the files that were removed.
    assert judge.room(problem).eager_ms is not None
    judge.prepare(problem).result()
    assert judge.scratch_bytes() >= 7 * OUT_BYTES
    judge.release(problem)
