"""Trajectory export: only correctness-preserving, high-gain, low-noise revisions timed on a known device are kept;
every row names the hardware that timed it, its move, the parent's and the child's measurements with their spread,
its winner's line and the judge's verdict; every other step is counted under one reason; a dataset card is written
beside the rows.

Timed steps come from a real cache: evaluations, steps and a finished run stored through ``KernelStore``, as the
evolver stores them on a GPU (the interpreter times nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from ks_inductor.evolve.diffs import apply_blocks, parse_blocks
from ks_inductor.training import DROP_REASONS, ExportStats, export_trajectories, select_steps
from tests.trajectories import CHILD, H100, PARENT, step, timed_cache


def test_selection_rules() -> None:
    keep = step("r", "k1")
    stats = ExportStats()
    kept = select_steps([
        keep,
        step("r", "k1", child=CHILD + "# a\n", lcb=1.03),  # below the gain
        step("r", "k1", child=CHILD + "# b\n", noise=0.2),  # too noisy
        step("r", "k1", child=CHILD + "# c\n", correct=False, verdict="rejected"),
        step("r", "k1", child=CHILD + "# d\n", lcb=None),  # untimed (interpreter)
        step("r", "k1", child=CHILD + "# f\n", fingerprint=None),  # timed, but where is not known
        step("r", "k1", child=CHILD + "# g\n", fingerprint={**H100.to_json(), "device_name": ""}),
        # the same revision on a second shape set where it did not gain: dropped everywhere
        step("r", "k1", child=CHILD + "# e\n"), step("r", "k2", child=CHILD + "# e\n", lcb=1.01),
    ], min_gain=0.05, max_noise=0.05, stats=stats)
    assert [ev.step for ev in kept] == [keep]
    assert stats.dropped == {"not_revision": 0, "incorrect": 1, "untimed": 1, "no_hardware": 2, "gain": 2,
                             "noise": 1, "other_shapes": 1}
    assert stats.steps == 9 == stats.kept + sum(stats.dropped.values())


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rows_carry_the_hardware_that_timed_them(tmp_path) -> None:
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    problem, run = timed_cache(store)
    stats = export_trajectories(store, "sft", tmp_path / "sft.jsonl", min_gain=0.05)
    rows = _rows(tmp_path / "sft.jsonl")
    assert stats.rows == len(rows) == 3 and stats.dropped["no_hardware"] == 1
    want = {"device_name": "NVIDIA H100 80GB HBM3", "capability": "sm_90", "sm_count": 132, "warp_size": 32,
            "backend": "cuda", "torch_version": "2.11.0+cu130", "triton_version": "3.6.0", "toolchain": "cuda-13.0",
            "fingerprint_id": H100.id}
    for r in rows:
        # The step's own fingerprint, or (the operator step) the one on its child's stored verdict: never a
        # placeholder, never empty.
        assert r["hardware"] == want, r["operator"]
        prompt = r["messages"][1]["content"]
        if r["operator"] != "llm":
            assert "device NVIDIA H100 80GB HBM3; 132 SMs; warp size 32" in prompt
            assert "memory bandwidth about 3.4 TB/s" in prompt and "None" not in prompt
            assert "class Model" in prompt and "speedup_eager 1.000" in prompt  # the parent's stored metrics
    by_op = {r["operator"]: r for r in rows}
    assert set(by_op) == {"param", "split_k", "llm"}
    assert by_op["llm"]["mutation"] == "llm-diff" and by_op["llm"]["messages"][1]["content"] == "improve this"
    param = by_op["param"]
    assert apply_blocks(PARENT, parse_blocks(param["messages"][-1]["content"])) == CHILD
    assert (param["parent_id"], param["child_id"], param["gain"]) == ("p", "c", pytest.approx(1.25))
    # The measurements with their spread, from the stored verdicts.
    assert param["parent"]["speedup"] == 1.0 and param["parent"]["iqr_ms"] == 0.01
    assert param["parent"]["noise"] == pytest.approx(0.01) and param["parent"]["timing_runs"] == 40
    assert param["child"]["speedup_lcb"] == 1.2 and param["child"]["median_ms"] == 0.8
    assert param["child"]["noise"] == pytest.approx(0.01) and param["child"]["speedup_eager_lcb"] == 1.2
    assert by_op["split_k"]["child"]["iqr_ms"] == 0.004
    # The winner's line: the parameter move is its only step, and its winning move.
    assert param["line"] == {"run_id": run, "finished": True, "winner_id": "c", "winner_speedup": 1.25,
                             "on_line": True, "position": 1, "length": 1, "winning_move": True}
    assert by_op["split_k"]["line"]["on_line"] is False
    assert param["judgment"]["verdict"] == "accepted" and param["judgment"]["trials"] == 5
    assert param["judgment"]["flags"] == [] and param["judgment"]["timed"] is True

    export_trajectories(store, "rl", tmp_path / "rl.jsonl", min_gain=0.05)
    rl = _rows(tmp_path / "rl.jsonl")
    assert len(rl) == 3 and all(r["extra_info"]["hardware"] == want for r in rl)
    r = next(r for r in rl if r["extra_info"]["operator"] == "param")
    assert r["reward_model"]["ground_truth"] == problem.source and r["extra_info"]["parent_code"] == PARENT
    assert r["prompt"][-1]["role"] == "user" and "132 SMs" in r["prompt"][-1]["content"]
    reward = r["extra_info"]["judgment"]
    assert (reward["verdict"], reward["correct"], reward["speedup_lcb"]) == ("accepted", True, 1.2)
    assert reward["evaluation_id"] is not None
    store.close()


def test_drop_reasons_add_up_and_the_card_counts_them(tmp_path, capsys) -> None:
    from ks_inductor.cli import main

    db = tmp_path / "k.db"
    with KernelStore(str(db)) as store:
        timed_cache(store)
        # A second device's search of the same problem: every step of it on that device's line.
        timed_cache(store, h200())
        read = len(store.steps())
    out = tmp_path / "data" / "steps.jsonl"
    assert main(["export-trajectories", "--db", str(db), "-o", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    got = json.loads(cap.out)  # stdout is the one JSON document
    assert got["ok"] and got["rows"] == got["kept"] == 6 and len(_rows(out)) == 6
    assert got["steps"] == read == 16
    assert got["kept"] + sum(got["dropped"].values()) == read
    assert set(got["dropped"]) == set(DROP_REASONS)
    assert {k: v for k, v in got["dropped"].items() if v} == {"not_revision": 2, "incorrect": 2, "no_hardware": 2,
                                                              "gain": 2, "noise": 2}
    for tally in (got["operators"], got["devices"]):
        assert sum(t["steps"] for t in tally.values()) == read
        for t in tally.values():
            assert t["kept"] + sum(t["dropped"].values()) == t["steps"]
    assert got["operators"]["split_k"] == {"steps": 4, "kept": 2, "dropped": {"incorrect": 2}, "correct": 2,
                                           "best_gain": pytest.approx(1.25)}
    assert got["devices"]["NVIDIA H200 (sm_90, cuda)"]["kept"] == 3
    assert got["devices"]["no hardware"] == {"steps": 2, "kept": 0, "dropped": {"no_hardware": 2}}
    assert "dropped: 2 not a revision" in cap.err and "split_k: 4 steps, 2 kept; dropped 2 incorrect" in cap.err

    card = Path(got["card"])
    assert card == tmp_path / "data" / "steps.card.md"
    text = card.read_text()
    assert "6 sft rows" in text and "16 steps read, 6 kept" in text
    assert "| split_k | 4 | 2 | 0 | 2 | 0 | 0 | 0 |" in text  # move, steps, kept, then each reason that dropped any
    assert "| NVIDIA H100 80GB HBM3 (sm_90, cuda) | 7 | 3 |" in text and "| no hardware | 2 | 0 |" in text
    assert "- min gain: 0.05" in text and "- max noise: 0.05" in text
    assert f"kernelsmith export-trajectories --format sft --db {db} --min-gain 0.05 --max-noise 0.05 -o {out}" in text

    # Without --json the same counts are the result, on stdout.
    assert main(["export-trajectories", "--db", str(db), "-o", str(out), "--min-gain", "0.3"]) == 0
    cap = capsys.readouterr()
    assert "wrote 0 sft rows" in cap.out and "10 gain below --min-gain" in cap.out
