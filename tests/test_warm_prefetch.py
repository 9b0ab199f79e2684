"""``warm`` starts Inductor's code generation for every region as soon as the regions are known: a region's
generation runs while the regions before it search, once per region, and a per-search limit still bounds a
search's wait for it. Code generation and the searches are stand-ins here (the test is about their timing)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from kernel_cache.store import KernelStore
from ks_inductor.catalogue.models import ThreeRegions
from ks_inductor.compiler import backend as B
from ks_inductor.evolve import EvolveConfig
from ks_inductor.judge.backends import current_fingerprint
from ks_inductor.seeds.inductor import generate
from ks_inductor.warm import problems_from_model, run
from ks_inductor.warm.prefetch import CodegenPrefetch, prefetch_workers

GEN_S = 0.6
SEARCH_S = 0.8


@pytest.fixture
def fake_codegen(monkeypatch):
    """Inductor's code generation as a sleep, with its calls noted: (problem key, start, end)."""
    calls: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def fake(problem, target, deadline=None):
        start = time.monotonic()
        wait = GEN_S if deadline is None else max(0.0, min(GEN_S, deadline - start))
        time.sleep(wait)
        with lock:
            calls.append((problem.key, start, time.monotonic()))
        return {}, {"inductor": "stand-in"}, wait < GEN_S

    monkeypatch.setattr(generate, "_generate", fake)
    monkeypatch.setattr(generate, "_memo", {})
    monkeypatch.setattr(generate, "_key_locks", {})
    return calls


@pytest.fixture
def problems(tmp_path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    probs = problems_from_model(ThreeRegions(), (torch.randn(8, 32),), db=f"sqlite:///{tmp_path}/trace.db",
                                judge_backend="triton-interpret")
    yield probs
    B.forget_stores()


def test_regions_code_generation_runs_while_the_regions_before_them_search(tmp_path, monkeypatch, fake_codegen,
                                                                            problems) -> None:
    searches: dict[str, tuple[float, float]] = {}

    def search(problem, config, store, judge, progress=False):
        # What a search does first: ask for Inductor's plans (the seeds), then judge for a while.
        start = time.monotonic()
        generate.inductor_programs(problem, "cpu")
        time.sleep(SEARCH_S)
        searches[problem.key] = (start, time.monotonic())
        return {"status": "no-kernel", "note": "stand-in search"}

    monkeypatch.setattr(run, "evolve_region", search)
    fp = current_fingerprint("triton-interpret")
    judge = SimpleNamespace(fingerprint=fp, backend=SimpleNamespace(device="cpu"), close=lambda: None)
    summary = run.warm(problems, KernelStore(f"sqlite:///{tmp_path}/k.db"),
                       EvolveConfig(backend="triton-interpret", parallel_regions=1), judge=judge)
    keys = [i.key for i in summary.items]
    assert len(keys) == 3 and all(k in searches for k in keys)
    # One generation per region, however many asked for it.
    assert sorted(k for k, _, _ in fake_codegen) == sorted(keys)
    started = {k: s for k, s, _ in fake_codegen}
    # The later regions' generations started before the first region's search ended.
    first_end = searches[keys[0]][1]
    assert started[keys[1]] < first_end, (started, searches)
    # And the later regions found them made (or nearly): their searches spent less than a generation waiting.
    for k in keys[1:]:
        s, e = searches[k]
        assert e - s < SEARCH_S + 0.5 * GEN_S, (k, e - s)


def test_a_prefetched_generation_ends_within_a_search_s_limit(fake_codegen, problems) -> None:
    """A search that finds its region's generation in progress waits for it: the generation ends within a
    search's limit of its start, so that the wait stays within the search's own limit."""
    limit = 0.2
    pre = CodegenPrefetch(problems[:1], "cpu", deadline=None, limit_s=limit, workers=1)
    time.sleep(0.05)
    t0 = time.monotonic()
    with generate.codegen_deadline(t0 + limit):
        generate.inductor_programs(problems[0], "cpu")
    waited = time.monotonic() - t0
    pre.close()
    assert waited <= limit + 0.1, waited


def test_prefetch_workers_leave_most_cores_to_the_judge() -> None:
    assert prefetch_workers(2) == 1
    assert prefetch_workers(16) == 4
    assert prefetch_workers(128) == 4
