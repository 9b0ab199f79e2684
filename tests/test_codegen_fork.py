"""Inductor's code generation for the seeds runs in processes forked from a warm parent (``generate.py``): the plans
are the ones a process started from nothing makes, a generation past its limit is ended without taking the parent
with it, and a generation that kills its parent is followed by one from a new parent. Interpreter target, CPU."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ks_inductor.catalogue.sources import small_problem
from ks_inductor.seeds.inductor import generate as G


@pytest.fixture
def fresh_memo(monkeypatch):
    monkeypatch.setattr(G, "_memo", {})
    monkeypatch.setattr(G, "_key_locks", {})


def _with_prologue(problem, line: str, name: str):
    """``problem`` whose source runs ``line`` first. Built without running it here: the line is for the generation's
    process (it sleeps, or kills its parent)."""
    return dataclasses.replace(problem, source=f"{line}\n{problem.source}", name=name, key=f"{problem.key}-{name}")


def _plans(programs):
    return {variant: prog.to_json() for variant, prog in programs.items()}


def test_forked_generations_make_the_plans_a_fresh_process_makes(fresh_memo):
    problem = small_problem("rmsnorm_bf16")
    forked, reasons, cut = G._generate(problem, "cpu")
    assert forked and not cut, reasons
    assert G._servers.get("cpu") is not None and G._servers["cpu"][0].alive
    started = G._run_forked
    try:
        G._run_forked = lambda *a: None
        fresh, _, _ = G._generate(problem, "cpu")
    finally:
        G._run_forked = started
    assert _plans(forked) == _plans(fresh)
    # With a parent up, no generation starts a process from nothing.
    fresh_run = G._run_fresh
    try:
        G._run_fresh = lambda *a: pytest.fail("a generation started from nothing while the parent was up")
        again, _, _ = G._generate(problem, "cpu")
    finally:
        G._run_fresh = fresh_run
    assert _plans(again) == _plans(forked)


def test_a_forked_generation_past_its_limit_is_ended_and_the_parent_stays(fresh_memo):
    problem = small_problem("rmsnorm_bf16")
    G._generate(problem, "cpu")  # the parent is up
    parent = G._servers["cpu"][0]
    slow = _with_prologue(problem, "import time\ntime.sleep(60)", "slow_rmsnorm")
    t0 = time.monotonic()
    with G.codegen_deadline(time.monotonic() + 1.5):
        programs, reasons = G.inductor_programs(slow, "cpu")
    assert programs == {} and 1.4 <= time.monotonic() - t0 < 5
    assert all("time limit ended Inductor's code generation" in r for r in reasons.values()), reasons
    assert parent.alive and G._servers["cpu"][0] is parent
    assert G._generate(problem, "cpu")[0]


def test_a_generation_that_kills_its_parent_is_followed_by_a_new_parent(fresh_memo):
    problem = small_problem("rmsnorm_bf16")
    G._generate(problem, "cpu")
    parent = G._servers["cpu"][0]
    killer = _with_prologue(problem, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "killer_rmsnorm")
    programs, reasons, _ = G._generate(killer, "cpu")
    time.sleep(0.5)
    assert not parent.alive
    programs, reasons, _ = G._generate(problem, "cpu")
    assert programs, reasons
    assert G._servers["cpu"][0] is not parent and G._servers["cpu"][0].alive
