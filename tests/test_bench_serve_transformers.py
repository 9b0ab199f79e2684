"""The generate() benchmark's runs folded into one result: the spread of the pack's ratios and each op's verdicts
run by run (``benchmarks/gpu/serve_transformers.py --merge``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "serve_transformers.py"


def _module():
    spec = importlib.util.spec_from_file_location("serve_transformers_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(ratio: float, liger: float, attention: tuple[str, bool, float]) -> dict:
    status, packed, speedup = attention
    return {"device": "GPU", "torch": "t", "triton": "tr", "transformers": "tf", "pack_vs_own": ratio,
            "pack_vs_liger": liger,
            "problems": [
                {"name": "rmsnorm", "inputs": "bfloat16[16, 1, 2048]", "packed": True,
                 "kernels": [{"status": "verified", "speedup_eager": 5.0 + ratio}]},
                {"name": "attention", "inputs": "bfloat16[16, 16, 1, 128]", "packed": packed,
                 "kernels": [{"status": status, "speedup_eager": speedup, "speedup_graph": speedup - 0.1},
                             {"status": "rejected"}]},
                {"name": "rope", "inputs": "bfloat16[16, 16, 1, 128]", "packed": False, "kernels": []}]}


def test_runs_merge_into_spreads_and_verdicts_run_by_run(tmp_path) -> None:
    runs = [_run(1.29, 1.52, ("rejected", False, 0.99)), _run(1.44, 1.99, ("race", True, 1.02)),
            _run(1.33, 1.55, ("race", True, 1.01))]
    merged = _module().merge_runs(runs)
    assert merged["pack_vs_own"] == {"min": 1.29, "median": 1.33, "max": 1.44, "n": 3}
    assert merged["pack_vs_liger"] == {"min": 1.52, "median": 1.55, "max": 1.99, "n": 3}
    att = merged["per_op_verdicts"]["attention bfloat16[16, 16, 1, 128]"]
    assert att["statuses"] == ["rejected", "race", "race"] and att["packed"] == [False, True, True]
    assert att["speedup_eager"] == {"min": 0.99, "median": 1.01, "max": 1.02, "n": 3}
    assert att["speedup_graph"] == pytest.approx({"min": 0.89, "median": 0.91, "max": 0.92, "n": 3})
    # an op with no kernel in any run keeps its rows, without a speedup
    rope = merged["per_op_verdicts"]["rope bfloat16[16, 16, 1, 128]"]
    assert rope["statuses"] == [None, None, None] and rope["speedup_eager"] is None
    assert merged["runs"] == runs and merged["device"] == "GPU" and "about" not in merged

    # the same from the command line, which a results file is written with
    files = []
    for i, r in enumerate(runs):
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(json.dumps(r))
    out = tmp_path / "merged.json"
    subprocess.run([sys.executable, str(SCRIPT), "--merge", *map(str, files), "--out", str(out), "--about", "x"],
                   check=True, cwd=ROOT)
    written = json.loads(out.read_text())
    assert written["about"] == "x" and written["pack_vs_own"]["median"] == 1.33
    assert list(written)[:5] == ["device", "torch", "triton", "transformers", "about"]
