"""Warm at the speed of the hardware (issue 37), measured with the real command line on this host's GPUs.

Parts, each a subprocess of its own with its own timeout (a hung part is killed with its process group and the next
one runs), the JSON rewritten after each:

- ``eval``: wall time of ``kernelsmith eval`` of a small problem on an idle GPU, as a user runs it (process start to
  exit), first with empty compile caches, then again with the caches the first left;
- ``throughput``: judged candidates per minute and per GPU-minute with the search protocol on small serving ops
  (``benchmarks/judge_throughput.py`` on every local GPU), with the per-stage split (``EvalResult.stage_s``);
- ``warm1`` and ``warmall``: ``kernelsmith warm`` of a one-layer Llama-style block from its config (random weights)
  into a fresh SQLite cache, once on one GPU (``CUDA_VISIBLE_DEVICES``) and once on all of them: wall time,
  judgments, judgments per minute, and the average GPU utilisation sampled here during the run
  (:mod:`ks_inductor.gpu_util`) beside the one warm reports itself;
- ``scaling``: judgments per minute of ``warmall`` over ``warm1``.

``targets`` compares the figures with the issue's goals. Each warm starts from empty Triton, Inductor and kernelsmith
caches of its own (``--shared-caches`` keeps the user's), so neither reuses the other's compiles.

    python benchmarks/gpu/warm_scaling.py                       # JSON to $OUT/warm_scaling.json, about 9 minutes
    python benchmarks/gpu/warm_scaling.py --parts eval,warm1 --warm-total 90 --wall 200
    python benchmarks/gpu/warm_scaling.py --backend triton-interpret --tiny --out /tmp/ws.json   # CPU check

``--wall`` bounds the whole run: a part gets at most what is left of it, and a part with too little left is skipped
and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ks_inductor.catalogue import PROBLEM_DIR  # noqa: E402 - importable once the checkout is on the path

PARTS = ("eval", "throughput", "warm1", "warmall")
EVAL_PROBLEM = ROOT / "tests" / "problems" / "rmsnorm.py"
EVAL_CANDIDATE = ROOT / "tests" / "candidates" / "rmsnorm_ok.py"
# Small serving ops: (name, problem file, candidate file or "seeds" for the embedded mutator's seeds).
OPS = {
    "rmsnorm": (ROOT / "tests" / "problems" / "rmsnorm.py", str(EVAL_CANDIDATE)),
    "rmsnorm_bf16_small": (PROBLEM_DIR / "cpu" / "rmsnorm_small.py", "seeds"),
    "softmax_bf16_small": (PROBLEM_DIR / "cpu" / "softmax_small.py", "seeds"),
}
# The goals.
TARGETS = {"per_gpu_minute": 120.0, "warm1_wall_s": 120.0, "warmall_wall_s": 45.0, "gpu_util_pct": 60.0,
           "scaling": 3.3, "eval_wall_s": 15.0}
SKIP_BELOW_S = 20.0
# warm's line for each region it finished (ks_inductor.warm.parallel._Board.end, or the sequential loop's).
REGION_LINE = re.compile(r": ([a-z-]+)\s+\((\d+) judged,\s+\d+s\)")  # a part with less time than this left is skipped rather than started to be killed


class Run:
    """The report and where it goes: rewritten whole after every part, so a killed run leaves what it measured."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out = out
        self.logs = out.parent / "warm_scaling_logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.wall
        self.interval_s: float = args.interval
        self.gpus: list[int] = []  # nvidia-smi indices this run's parts may use; empty on a CPU
        self.report: dict[str, Any] = {"benchmark": "warm_scaling", "args": vars(args), "host": host_info(),
                                       "parts": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.report["wall_s"] = time.monotonic() - self.t0
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report, indent=2, default=str) + "\n")
        tmp.replace(self.out)


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for mod in ("torch", "triton", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing module is a fact to report
            info[mod] = None
    info["gpus"] = gpu_names()
    info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return info


def gpu_names() -> list[dict[str, Any]]:
    """Index and name of every GPU nvidia-smi sees (without a CUDA context in this process: it would sit on GPU 0
    for the whole run); empty without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in done.stdout.splitlines():
        idx, _, name = line.partition(",")
        if idx.strip().isdigit():
            out.append({"index": int(idx), "name": name.strip()})
    return out


def local_gpus() -> list[int]:
    """This process's GPUs by nvidia-smi index, in CUDA's order: ``CUDA_VISIBLE_DEVICES`` when it lists indices,
    else every GPU nvidia-smi sees; empty on a CPU host."""
    from ks_inductor.gpu_util import visible_indices

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and visible_indices() is not None:
        return [int(v) for v in listed.split(",") if v.strip()]
    seen = [g["index"] for g in gpu_names()]
    if seen:
        return seen
    try:
        import torch

        return list(range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001
        return []


def run_part(cmd: list[str], timeout_s: float, log: Path, env: dict[str, str] | None = None,
             cwd: Path = ROOT) -> dict[str, Any]:
    """Run ``cmd`` in a session of its own, killed with its whole process group (judge workers included) past
    ``timeout_s``: returncode, wall time, whether it timed out, stdout (also kept in ``log``) and stderr's tail."""
    t0 = time.monotonic()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        timed_out = False
        try:
            stdout, _ = proc.communicate(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            stdout, _ = proc.communicate()
    wall = time.monotonic() - t0
    log.with_suffix(".out").write_text(stdout or "")
    tail = log.read_text(errors="replace")[-3000:]
    return {"cmd": cmd, "returncode": proc.returncode, "wall_s": round(wall, 3), "timed_out": timed_out,
            "stdout": stdout or "", "stderr_tail": tail}


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object (the commands print theirs last)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def fresh_caches(env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` with Triton's, Inductor's and kernelsmith's caches in empty folders under ``root``."""
    for name, var in (("triton", "TRITON_CACHE_DIR"), ("inductor", "TORCHINDUCTOR_CACHE_DIR"),
                      ("home", "KERNELSMITH_HOME")):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    return env


def sampled(run: Run, fn: Any) -> tuple[Any, list[dict[str, Any]], str | None]:
    """``fn()`` with the GPUs' utilisation sampled meanwhile: (its result, per-GPU summary, source)."""
    from ks_inductor.gpu_util import GpuSampler

    gpu = GpuSampler(interval_s=run.interval_s, gpus=run.gpus or None)
    with gpu:
        result = fn()
    return result, gpu.summary(), gpu.source


# ------------------------------------------------------------------ parts


def part_eval(run: Run, args: argparse.Namespace, env: dict[str, str], work: Path, timeout: float) -> dict[str, Any]:
    """``kernelsmith eval`` on the first GPU alone, with empty caches, then again with what the first left."""
    env = fresh_caches(dict(env), work / "eval-caches")
    if run.gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(run.gpus[0])
    cmd = [sys.executable, "-m", "ks_inductor.cli", "eval", str(EVAL_PROBLEM), str(EVAL_CANDIDATE),
           "--backend", args.backend, "--json"]
    runs = []
    end = time.monotonic() + timeout
    for k in range(args.eval_runs):
        left = end - time.monotonic()
        if left < 5:
            break
        out = run_part(cmd, left, run.logs / f"eval-{k}.log", env)
        res = last_json(out["stdout"]) or {}
        runs.append({"caches": "empty" if k == 0 else "warm", "wall_s": out["wall_s"], "returncode": out["returncode"],
                     "timed_out": out["timed_out"], "verdict": res.get("verdict"),
                     "duration_s": res.get("duration_s"), "stage_s": res.get("stage_s"),
                     **({} if res else {"stderr_tail": out["stderr_tail"]})})
    ok = bool(runs) and all(r["returncode"] == 0 for r in runs)
    return {"status": "ok" if ok else "failed", "problem": EVAL_PROBLEM.name, "candidate": EVAL_CANDIDATE.name,
            "gpu": run.gpus[0] if run.gpus else None, "runs": runs,
            "wall_s": runs[0]["wall_s"] if runs else None,
            "wall_s_warm_caches": runs[1]["wall_s"] if len(runs) > 1 else None}


def part_throughput(run: Run, args: argparse.Namespace, env: dict[str, str], work: Path,
                    timeout: float) -> dict[str, Any]:
    """``benchmarks/judge_throughput.py`` per small serving op on every local GPU, each op its share of the part's
    time."""
    ops = [o for o in args.ops.split(",") if o]
    results: dict[str, Any] = {}
    end = time.monotonic() + timeout
    for i, name in enumerate(ops):
        problem, candidate = OPS[name]
        left = end - time.monotonic()
        if left < SKIP_BELOW_S / 2:
            results[name] = {"status": "skipped", "note": "no time left in the part"}
            continue
        share = left / (len(ops) - i)
        out_json = work / f"throughput-{name}.json"
        cmd = [sys.executable, "-m", "benchmarks.judge_throughput", "--problem", str(problem), "--candidate",
               candidate, "--n", str(args.n), "--backend", args.backend, "--out", str(out_json)]
        out, util, source = sampled(run, lambda cmd=cmd, share=share, name=name: run_part(
            cmd, share, run.logs / f"throughput-{name}.log", env))
        rep = json.loads(out_json.read_text()) if out_json.exists() else None
        results[name] = {"status": "ok" if rep and out["returncode"] == 0 else
                         ("timeout" if out["timed_out"] else "failed"),
                         "process_wall_s": out["wall_s"], "gpu_util": util, "gpu_util_source": source,
                         **({"report": rep} if rep else {"stderr_tail": out["stderr_tail"]})}
    done = [r["report"] for r in results.values() if r.get("report")]
    summary = {}
    if done:
        judged = sum(r["judged"] for r in done)
        wall = sum(r["wall_s"] for r in done)
        devices = max(r["devices"] for r in done)
        stages: dict[str, float] = {}
        for r in done:
            for k, v in r["stage_s_mean"].items():
                stages[k] = stages.get(k, 0.0) + v * r["judged"]
        summary = {"judged": judged, "wall_s": wall, "devices": devices,
                   "per_minute": 60.0 * judged / wall if wall else None,
                   "per_gpu_minute": 60.0 * judged / wall / max(1, devices) if wall else None,
                   "stage_s_mean": {k: v / judged for k, v in sorted(stages.items(), key=lambda kv: -kv[1])}}
    ok = bool(done) and all(r["status"] == "ok" for r in results.values())
    return {"status": "ok" if ok else ("partial" if done else "failed"), "ops": results, **summary}


def llama_overrides(args: argparse.Namespace) -> list[str]:
    return [f"hidden_size={args.hidden}", f"intermediate_size={args.intermediate}",
            f"num_attention_heads={args.heads}", f"num_key_value_heads={args.kv_heads}", "num_hidden_layers=1",
            f"vocab_size={args.vocab}", f"max_position_embeddings={max(2048, args.seq)}"]


def part_warm(run: Run, args: argparse.Namespace, env: dict[str, str], work: Path, timeout: float,
              gpus: list[int], name: str) -> dict[str, Any]:
    """``kernelsmith warm --hf-config llama`` of one layer on ``gpus`` into a fresh cache."""
    env = dict(env)
    if not args.shared_caches:
        env = fresh_caches(env, work / f"{name}-caches")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    db = work / f"{name}.db"
    # warm's own whole-run limit ends it cleanly with its JSON; the part's timeout is the backstop.
    total = max(10.0, min(args.warm_total, timeout - args.startup_slack))
    cmd = [sys.executable, "-m", "ks_inductor.cli", "warm", "--hf-config", "llama"]
    for kv in llama_overrides(args):
        cmd += ["--hf-set", kv]
    cmd += ["--batch", str(args.batch), "--seq", str(args.seq), "--dtype", args.dtype, "--budget", str(args.budget),
            "--total-time", f"{total:g}", "--backend", args.backend, "--db", f"sqlite:///{db}", "--json"]
    if args.time_limit:
        cmd += ["--time-limit", f"{args.time_limit:g}"]
    if args.parallel_regions:
        cmd += ["--parallel-regions", str(args.parallel_regions)]
    out, util, source = sampled(run, lambda: run_part(cmd, timeout, run.logs / f"{name}.log", env))
    res = last_json(out["stdout"])
    from ks_inductor.gpu_util import mean_of

    report: dict[str, Any] = {"gpus": gpus, "total_time_s": total, "process_wall_s": out["wall_s"],
                              "returncode": out["returncode"], "timed_out": out["timed_out"],
                              "gpu_util_sampled": util, "gpu_util_source": source,
                              "gpu_util_mean": mean_of(util, gpus or None)}
    if res is None:
        # Killed before its JSON: what the regions it finished printed still says how far it got.
        done = REGION_LINE.findall((run.logs / f"{name}.log").read_text(errors="replace"))
        judged = sum(int(n) for _, n in done)
        report.update({"regions_finished": sum(st != "not-run" for st, _ in done), "judged": judged,
                       "judgments_per_min_process": 60.0 * judged / out["wall_s"] if out["wall_s"] else None})
        return {"status": "timeout" if out["timed_out"] else "failed", **report, "stderr_tail": out["stderr_tail"]}
    items = res.get("items", [])
    judged = sum(int(i.get("judged", 0)) for i in items)
    wall = float(res.get("wall_s") or 0.0)
    statuses: dict[str, int] = {}
    for i in items:
        statuses[i["status"]] = statuses.get(i["status"], 0) + 1
    report.update({
        "regions": len(items), "statuses": statuses, "found": res.get("found"), "judged": judged,
        "warm_wall_s": wall,
        "judgments_per_min": 60.0 * judged / wall if wall else None,
        "judgments_per_min_process": 60.0 * judged / out["wall_s"] if out["wall_s"] else None,
        "gpu_util_warm": res.get("gpu_util"), "gpu_util_warm_source": res.get("gpu_util_source"),
        "items": [{k: i.get(k) for k in ("name", "signature", "status", "judged", "accepted", "best_speedup",
                                         "wall_s", "note")} for i in items],
    })
    # Reached every region within the limit: the run's wall time is what warming this block takes.
    report["complete"] = not any(i["status"] == "not-run" for i in items) and not out["timed_out"]
    status = "ok" if out["returncode"] == 0 else "failed"
    return {"status": status, **report}


def scaling(parts: dict[str, Any]) -> dict[str, Any] | None:
    one, many = parts.get("warm1") or {}, parts.get("warmall") or {}
    a, b = one.get("judgments_per_min"), many.get("judgments_per_min")
    if not a or not b:
        return None
    out = {"gpus": len(many.get("gpus") or []) or None, "judgments_per_min_1": a, "judgments_per_min_all": b,
           "ratio": b / a}
    pa, pb = one.get("judgments_per_min_process"), many.get("judgments_per_min_process")
    if pa and pb:
        out["ratio_process"] = pb / pa
    return out


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """Each measured figure beside the issue's goal (None where the part did not run)."""
    p = report["parts"]

    def check(value: Any, goal: float, at_least: bool) -> dict[str, Any]:
        if value is None:
            return {"value": None, "goal": goal, "met": None}
        return {"value": value, "goal": goal, "met": value >= goal if at_least else value <= goal}

    util = [(p.get(n) or {}).get("gpu_util_mean") for n in ("warm1", "warmall")]
    return {
        "per_gpu_minute": check((p.get("throughput") or {}).get("per_gpu_minute"), TARGETS["per_gpu_minute"], True),
        "warm1_wall_s": check((p.get("warm1") or {}).get("process_wall_s"), TARGETS["warm1_wall_s"], False),
        "warmall_wall_s": check((p.get("warmall") or {}).get("process_wall_s"), TARGETS["warmall_wall_s"], False),
        "gpu_util_warm1_pct": check(util[0], TARGETS["gpu_util_pct"], True),
        "gpu_util_warmall_pct": check(util[1], TARGETS["gpu_util_pct"], True),
        "scaling": check((report.get("scaling") or {}).get("ratio"), TARGETS["scaling"], True),
        "eval_wall_s": check((p.get("eval") or {}).get("wall_s"), TARGETS["eval_wall_s"], False),
    }


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON path (default $OUT/warm_scaling.json, else ./warm_scaling.json)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, run in this order: {', '.join(PARTS)}")
    p.add_argument("--backend", default="triton-cuda", help="judge backend (triton-interpret for a CPU check)")
    p.add_argument("--tiny", action="store_true", help="a small block, budget and counts: checks the script on a CPU")
    p.add_argument("--wall", type=float, default=530.0, help="seconds for the whole run (default 530)")
    # On a 4-GPU H100 host with empty caches, one eval took longer than 60 s and 48 judgments of one op longer
    # than 33 s, so the defaults leave room for a cold start.
    p.add_argument("--eval-timeout", type=float, default=150.0, help="seconds for the eval part (default 150)")
    p.add_argument("--eval-runs", type=int, default=2, help="evals: the first with empty caches (default 2)")
    p.add_argument("--throughput-timeout", type=float, default=240.0, help="seconds for all ops (default 240)")
    p.add_argument("--ops", default=",".join(OPS), help=f"serving ops judged: {', '.join(OPS)}")
    p.add_argument("--n", type=int, default=48, help="candidates judged per op (default 48)")
    p.add_argument("--warm-timeout", type=float, default=175.0, help="seconds per warm part (default 175)")
    p.add_argument("--warm-total", type=float, default=125.0,
                   help="warm --total-time, seconds, cut to fit the part's timeout (default 125)")
    p.add_argument("--startup-slack", type=float, default=45.0,
                   help="seconds of a warm part kept beyond --total-time for what the limit does not bound: the "
                        "process start, tracing, a seed's code generation in progress (default 45)")
    p.add_argument("--time-limit", type=float, default=None, help="warm --time-limit per region (default none)")
    p.add_argument("--budget", type=int, default=16, help="warm --budget per region (default 16)")
    p.add_argument("--parallel-regions", type=int, default=None,
                   help="warm --parallel-regions (default: warm's own, one per GPU)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between GPU utilisation samples")
    p.add_argument("--shared-caches", action="store_true",
                   help="warm with the user's compile caches instead of empty ones per run")
    args = p.parse_args(argv)
    if args.tiny:
        # Seconds on two CPU cores with the interpreter judge; the figures mean nothing there.
        for k, v in {"hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "vocab": 128, "batch": 1,
                     "seq": 8, "dtype": "fp32", "budget": 2, "n": 4, "ops": "rmsnorm", "eval_runs": 1,
                     "warm_total": 60.0, "startup_slack": 20.0}.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    unknown = set(args.ops.split(",")) - set(OPS)
    if unknown:
        p.error(f"unknown ops {sorted(unknown)}; choose from {', '.join(OPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or (Path(os.environ["OUT"]) / "warm_scaling.json" if os.environ.get("OUT")
                            else "warm_scaling.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    run = Run(out, args)
    run.gpus = local_gpus() if args.backend != "triton-interpret" else []
    run.report["gpus_used"] = run.gpus
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if args.backend == "triton-interpret":
        env["TRITON_INTERPRET"] = "1"
    work = Path(tempfile.mkdtemp(prefix="ks-warm-scaling-"))
    run.report["workdir"] = str(work)
    parts = [p for p in PARTS if p in args.parts.split(",")]
    timeouts = {"eval": args.eval_timeout, "throughput": args.throughput_timeout, "warm1": args.warm_timeout,
                "warmall": args.warm_timeout}
    run.save()
    for name in parts:
        timeout = min(timeouts[name], run.left())
        if timeout < SKIP_BELOW_S:
            run.report["parts"][name] = {"status": "skipped", "note": f"{run.left():.0f} s left of --wall"}
            run.save()
            continue
        print(f"warm_scaling: {name} (up to {timeout:.0f} s)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            if name == "eval":
                res = part_eval(run, args, env, work, timeout)
            elif name == "throughput":
                res = part_throughput(run, args, env, work, timeout)
            elif name == "warm1":
                res = part_warm(run, args, env, work, timeout, run.gpus[:1], name)
            else:
                res = part_warm(run, args, env, work, timeout, run.gpus, name)
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others' figures
            res = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        res["part_wall_s"] = round(time.monotonic() - t0, 3)
        run.report["parts"][name] = res
        run.report["scaling"] = scaling(run.report["parts"])
        run.report["targets"] = targets(run.report)
        run.save()
        print(f"warm_scaling: {name} {res.get('status')} in {res['part_wall_s']:.0f} s", file=sys.stderr, flush=True)
    run.report["targets"] = targets(run.report)
    run.save()
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"out": str(out), "targets": run.report["targets"]}, indent=2))
    statuses = [run.report["parts"][n]["status"] for n in parts]
    return 0 if all(s == "ok" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
