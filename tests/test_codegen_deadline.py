"""A search's time limit bounds Inductor's code generation for its seeds: a generation that would run past the limit
is ended with everything it started, is not remembered (a later search with time left generates it), and
``evolve_problem`` with Inductor's seeds on still ends within 10% of its limit. The code generator is replaced by a
slow stand-in (a real process, with a child that holds its output pipes), so that the limit, not Inductor's speed on
this host, is what is tested."""

from __future__ import annotations

import sys
import time

import pytest

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.seeds.inductor import generate as G

# Sleeps with a grandchild that inherits stdout and stderr, as Inductor's compile workers do; then, given time,
# runs the real generator.
SLOW = ("import runpy, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "time.sleep(60)\n"
        "runpy.run_module('ks_inductor.seeds.inductor.codegen', run_name='__main__')\n")


@pytest.fixture
def slow_codegen(monkeypatch):
    monkeypatch.setattr(G, "CODEGEN_CMD", [sys.executable, "-c", SLOW])
    monkeypatch.setattr(G, "_run_forked", lambda *a: None)  # generations start from CODEGEN_CMD
    monkeypatch.setattr(G, "_memo", {})
    monkeypatch.setattr(G, "_key_locks", {})


def test_the_limit_ends_code_generation_and_it_is_not_remembered(slow_codegen):
    problem = small_problem("rmsnorm_bf16")
    t0 = time.monotonic()
    with G.codegen_deadline(time.monotonic() + 1.5):
        programs, reasons = G.inductor_programs(problem, "cpu")
    took = time.monotonic() - t0
    assert programs == {} and 1.4 <= took < 8, took
    assert reasons and all("time limit ended Inductor's code generation" in r for r in reasons.values())
    assert G._memo == {}

    t0 = time.monotonic()
    with G.codegen_deadline(time.monotonic() - 1):
        programs, reasons = G.inductor_programs(problem, "cpu")
    assert programs == {} and time.monotonic() - t0 < 0.5  # no time left: no process started
    assert all("left no time" in r for r in reasons.values())
    assert G._memo == {}


def test_evolve_with_inductor_seeds_holds_its_limit(tmp_path, slow_codegen):
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    limit = 12.0
    cfg = EvolveConfig(budget=500, islands=2, parallel=2, seed=5, time_limit_s=limit, backend="triton-interpret",
                       judge_trials=2, inductor_seeds=True)
    t0 = time.monotonic()
    summary = evolve_problem(problem, cfg, store, progress=False)
    took = time.monotonic() - t0
    assert took <= 1.10 * limit, took
    assert summary.stop_reason == "time"
