"""The hit-cost benchmark (``benchmarks/gpu/compiled_hit_cost.py``) times a graph that serves a hit: its warm stores
a kernel, and each timed process swaps it in, running the judged plan, with Inductor's outputs."""

from __future__ import annotations

import pytest

from benchmarks.gpu.compiled_hit_cost import time_variant, warm_cache


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> str:
    db = str(tmp_path_factory.mktemp("hit-cost") / "k.db")
    got = warm_cache(db, rows=16, hidden=64, budget=3, time_limit_s=60.0, device="cpu")
    # the warm judges against eager alone, so a norm Inductor runs near its floor still leaves a hit to time
    assert got == {"found": 1, "regions": 1}
    return db


@pytest.mark.parametrize("variant", ["triton_op", "custom_op"])
def test_each_timed_process_serves_the_hit_from_its_judged_plan(warmed, variant):
    got = time_variant(warmed, variant, rows=16, hidden=64, rounds=1, calls=2, device="cpu")
    assert got["swapped"] == 1
    assert got["launch"] == ["judged plan"]  # on the CPU the backend runs the plan per call, as a custom_op
    assert got["max_abs_diff"] < 1e-5
    assert got["served_us"] > 0 and got["inductor_us"] > 0
