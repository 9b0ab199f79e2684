"""benchmarks/gpu/warm_scaling.py on a CPU: a hung part is killed with everything it started and the run goes on,
a part with no time left is skipped with the JSON still written, and the eval and throughput parts run end to end
with the interpreter judge (its figures mean nothing there; the plumbing is what is checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "warm_scaling.py"
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import warm_scaling as WS  # noqa: E402 - a script's folder, put on the path above


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_part_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    cmd = ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"]
    t0 = time.monotonic()
    out = WS.run_part(cmd, 1.0, tmp_path / "hung.log")
    assert out["timed_out"] and out["returncode"] != 0
    assert time.monotonic() - t0 < 15
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_last_json_and_scaling():
    assert WS.last_json("progress\n{\"a\": 1}\nnot json {\n") == {"a": 1}
    assert WS.last_json("nothing") is None
    parts = {"warm1": {"judgments_per_min": 30.0, "judgments_per_min_process": 20.0, "gpus": [0]},
             "warmall": {"judgments_per_min": 105.0, "judgments_per_min_process": 60.0, "gpus": [0, 1, 2, 3]}}
    s = WS.scaling(parts)
    assert s["ratio"] == 3.5 and s["ratio_process"] == 3.0 and s["gpus"] == 4
    assert WS.scaling({"warm1": parts["warm1"]}) is None
    # A warm killed before its JSON: the regions it printed as finished (rich wraps them on a narrow console).
    log = "  norm_add ab12: found (3 judged, \n12s)\n  matmul_mm cd34: no-kernel (0 judged, 4s)\n"
    assert WS.REGION_LINE.findall(log) == [("found", "3"), ("no-kernel", "0")]


def _run(args: list[str], tmp_path: Path, timeout: float) -> tuple[int, dict]:
    out = tmp_path / "ws.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "--backend", "triton-interpret", "--tiny", "--out", str(out),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), done.stderr[-2000:]
    return done.returncode, json.loads(out.read_text())


def test_a_part_without_time_left_is_skipped_and_reported(tmp_path):
    rc, report = _run(["--parts", "warm1,warmall", "--wall", "5"], tmp_path, 120)
    assert rc == 1
    assert {k: v["status"] for k, v in report["parts"].items()} == {"warm1": "skipped", "warmall": "skipped"}
    assert report["targets"]["scaling"] == {"value": None, "goal": 3.3, "met": None}


def test_eval_and_throughput_parts_on_the_interpreter(tmp_path):
    rc, report = _run(["--parts", "eval,throughput", "--n", "3"], tmp_path, 400)
    ev, tp = report["parts"]["eval"], report["parts"]["throughput"]
    assert rc == 0, report
    assert ev["status"] == "ok" and ev["runs"][0]["verdict"] == "accepted" and ev["wall_s"] > 0
    assert ev["runs"][0]["stage_s"]["correctness"] > 0
    assert tp["status"] == "ok" and tp["judged"] == 3 and tp["per_gpu_minute"] > 0
    assert tp["ops"]["rmsnorm"]["report"]["verdicts"] == {"accepted": 3}
    assert "correctness" in tp["stage_s_mean"]
    assert tp["ops"]["rmsnorm"]["gpu_util"] == []  # nothing to sample on a CPU
    assert report["targets"]["eval_wall_s"]["value"] == ev["wall_s"]
