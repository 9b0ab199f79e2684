"""Trajectory export: only correctness-preserving, high-gain, low-noise revisions are kept; SFT rows are chat
messages, RL rows carry the reference and the parent code."""

from __future__ import annotations

import json

import pytest

from kernel_cache.record import StepRecord
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from ks_inductor.evolve.diffs import apply_blocks, parse_blocks
from ks_inductor.training import ExportStats, export_trajectories, select_steps
from tests.test_evolve_families import small_problem

PARENT = "import triton\n\n\ndef launch():\n    k[(1,)](x, BLOCK=128, num_warps=4)\n"
CHILD = "import triton\n\n\ndef launch():\n    k[(1,)](x, BLOCK=256, num_warps=8)\n"


def step(run: str, key: str, child: str = CHILD, parent_speed: float = 1.0, lcb: float = 1.2, noise: float = 0.01,
         correct: bool = True, verdict: str = "accepted", prompt: str | None = None,
         response: str | None = None) -> StepRecord:
    return StepRecord(run_id=run, problem_key=key, child_id="c", mutation="param", parent_id="p", verdict=verdict,
                      correct=correct, parent_speedup=parent_speed, child_speedup=None if lcb is None else lcb + 0.05,
                      parent_speedup_lcb=parent_speed - 0.02, child_speedup_lcb=lcb, noise=noise,
                      parent_source=PARENT, child_source=child, prompt=prompt, response=response)


def test_selection_rules() -> None:
    keep = step("r", "k1")
    stats = ExportStats()
    kept = select_steps([
        keep,
        step("r", "k1", child=CHILD + "# a\n", lcb=1.03),  # below the gain
        step("r", "k1", child=CHILD + "# b\n", noise=0.2),  # too noisy
        step("r", "k1", child=CHILD + "# c\n", correct=False, verdict="rejected"),
        step("r", "k1", child=CHILD + "# d\n", lcb=None),  # untimed (interpreter)
        # the same revision on a second shape set where it did not gain: dropped everywhere
        step("r", "k1", child=CHILD + "# e\n"), step("r", "k2", child=CHILD + "# e\n", lcb=1.01),
    ], min_gain=0.05, max_noise=0.05, stats=stats)
    assert kept == [keep]
    assert (stats.dropped_gain, stats.dropped_noise, stats.dropped_incorrect, stats.dropped_untimed) == (3, 1, 1, 1)


def test_export_rows(tmp_path) -> None:
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    problem = small_problem("rmsnorm_bf16")
    store.upsert_problem(problem)
    run = store.start_run(problem.key, h200(), {})
    store.add_step(step(run, problem.key))
    store.add_step(step(run, problem.key, child=CHILD + "# llm\n", prompt="improve this", response="an edit"))
    store.add_step(step(run, problem.key, child=CHILD + "# slow\n", lcb=0.9))
    stats = export_trajectories(store, "sft", tmp_path / "sft.jsonl", min_gain=0.05)
    rows = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert stats.rows == 2 and len(rows) == 2
    by_resp = {r["messages"][-1]["content"]: r for r in rows}
    assert "an edit" in by_resp and by_resp["an edit"]["messages"][1]["content"] == "improve this"
    synth = next(r for k, r in by_resp.items() if k != "an edit")
    assert [m["role"] for m in synth["messages"]] == ["system", "user", "assistant"]
    assert "class Model" in synth["messages"][1]["content"]  # the reference is in the prompt
    assert apply_blocks(PARENT, parse_blocks(synth["messages"][-1]["content"])) == CHILD
    # Each row names its step: the operator, the parent and the child, and the gain (child over parent speedup).
    assert (synth["operator"], synth["parent_id"], synth["child_id"]) == ("param", "p", "c")
    assert synth["gain"] == pytest.approx(1.25)
    # The statistics count every step by operator, kept or not.
    assert stats.operators["param"].to_json() == {"steps": 3, "correct": 3, "kept": 2, "best_gain": pytest.approx(1.25)}
    export_trajectories(store, "rl", tmp_path / "rl.jsonl", min_gain=0.05)
    rl = [json.loads(x) for x in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert len(rl) == 2 and rl[0]["data_source"] == "kernel_rl"
    assert rl[0]["reward_model"]["ground_truth"] == problem.source
    assert rl[0]["extra_info"]["parent_code"] == PARENT and rl[0]["prompt"][-1]["role"] == "user"
    assert rl[0]["extra_info"]["operator"] == "param" and rl[0]["extra_info"]["gain"] == pytest.approx(1.25)
    store.close()
