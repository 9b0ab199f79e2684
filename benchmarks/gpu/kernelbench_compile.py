"""KernelBench problems the way a user runs a model through kernelsmith: ``kernelsmith warm PROBLEM.py`` (the regions a
compile will look up, each searched from Inductor's own kernels and the op-family templates), then
``torch.compile(model, backend="kernelsmith")`` against eager and ``torch.compile`` (Inductor) in one process.

    python benchmarks/gpu/kernelbench_compile.py KERNELBENCH_DIR 1/19,1/23,2/12 TAG [--budget 32]
        [--time-limit SECONDS] [--total-time SECONDS] [--max-mib M] [--parallel P] [--backend triton-cuda]
        [--phase both|warm|measure] [--db FILE]

Problems run at KernelBench's own sizes. ``--max-mib`` (off by default) shrinks a problem's size constants
(module-level ``NAME = int`` lines, the largest halved first) until its inputs and outputs fit in M MiB; the shapes
used are recorded. ``--phase warm`` stops after the warm (its database is ``$OUT/kernelbench-compile-TAG.db``);
``--phase measure --db FILE`` measures against a database an earlier warm left, so the two fit separate device calls.
Per problem: the warm's regions, their rooms and verdicts, whether an Inductor seed was judged correct, the compile's
regions served, eager / Inductor / kernelsmith times (CUDA events, L2 flushed before each call, interleaved rounds,
medians) with the largest difference from eager, and the problem's floor (its bytes at the copy rate measured in the
same process, its FLOPs at the measured matmul rate). Writes ``$OUT/kernelbench-compile-TAG.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_SIZE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*(#.*)?$", re.M)
_SIZE_NAMES = re.compile(r"(batch|dim|features|length|size|channels|^[NMKLBHWD]\d?$|seq|height|width|depth|tokens)",
                         re.I)


def shrink(source: str, max_bytes: int) -> tuple[str, dict[str, int]]:
    """``source`` with its largest size constants halved until the problem's inputs and outputs fit ``max_bytes``."""
    from ks_inductor.problem_tracing import problem_from_source

    consts = {m.group(1): int(m.group(2)) for m in _SIZE.finditer(source)
              if _SIZE_NAMES.search(m.group(1)) and "kernel" not in m.group(1).lower()}
    for _ in range(64):
        p = problem_from_source(source, name="shrink")
        if p.bytes_moved <= max_bytes or not consts:
            break
        name = max(consts, key=consts.get)
        if consts[name] < 32:
            break
        consts[name] //= 2
        source = re.sub(rf"^{name}\s*=\s*\d+", f"{name} = {consts[name]}", source, count=1, flags=re.M)
    return source, consts


def _cli(args: list[str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "ks_inductor.cli", *args], capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return 124, "", "timed out", time.time() - t0


def inductor_seed_verdicts(db_file: str, keys: list[str]) -> dict[str, dict[str, int]]:
    """Per region key: Inductor seeds judged, and judged correct (from the search's recorded steps)."""
    out: dict[str, dict[str, int]] = {}
    con = sqlite3.connect(db_file)
    try:
        for key in keys:
            rows = con.execute("select verdict, detail from evolution_steps where problem_key=? and mutation='seed'",
                               (key,)).fetchall()
            seeds = [(v, json.loads(d or "{}")) for v, d in rows]
            ind = [v for v, d in seeds if "Inductor's kernels" in (d.get("child_source") or "")[:300]]
            out[key] = {"inductor_seeds": len(ind), "inductor_correct": sum(v == "accepted" for v in ind),
                        "seeds": len(seeds), "correct": sum(v == "accepted" for v, _ in seeds)}
    finally:
        con.close()
    return out


# ----------------------------------------------------------------------------------------- measuring (child process)


def measure(path: str, db: str, rounds: int, device: str = "cuda") -> dict[str, Any]:
    """Eager, Inductor and kernelsmith on one problem, in this process."""
    import torch

    from ks_inductor.compiler.backend import compile_reports
    from ks_inductor.judge.timing import benchmark_interleaved, make_l2_flush
    from ks_inductor.warm import kernelbench_model

    model, inputs = kernelbench_model(path, device=device)
    with torch.no_grad():
        ref = model(*inputs)
        ind = torch.compile(model)
        n0 = len(compile_reports())
        from torch._dynamo import list_backends

        # By name, as a user writes it, where the package is installed (its entry point registers the name).
        backend: Any = "kernelsmith"
        if "kernelsmith" not in list_backends(exclude_tags=()):
            from ks_inductor.compiler.backend import kernelsmith_backend as backend
        ks = torch.compile(model, backend=backend, options={"kernelsmith.db": db})
        out: dict[str, Any] = {}
        fns = {"eager": lambda: model(*inputs), "inductor": lambda: ind(*inputs), "kernelsmith": lambda: ks(*inputs)}
        for name in ("inductor", "kernelsmith"):
            got = fns[name]()
            refs, gots = (ref if isinstance(ref, (tuple, list)) else [ref]), (got if isinstance(got, (tuple, list))
                                                                               else [got])
            err = max(float((g.float() - r.float()).abs().max()) for g, r in zip(gots, refs)
                      if isinstance(g, torch.Tensor))
            ok = all(torch.allclose(g.float(), r.float(), atol=1e-2, rtol=1e-2) for g, r in zip(gots, refs)
                     if isinstance(g, torch.Tensor))
            out[name] = {"max_abs_diff": err, "correct": bool(ok)}
        reports = compile_reports()[n0:]
        out["regions"] = sum(len(r.regions) for r in reports)
        out["served"] = sum(r.swapped for r in reports)
        out["keys"] = [g.key for r in reports for g in r.regions if g.key]
        out["region_status"] = [f"{g.kind}:{g.status}" for r in reports for g in r.regions]
        samples = benchmark_interleaved(fns, rounds=rounds, flush=make_l2_flush(device), device=device)
    med = {k: sorted(x for r in v for x in r)[len([x for r in v for x in r]) // 2] for k, v in samples.items()}
    out["ms"] = med
    out["vs_inductor"] = med["inductor"] / med["kernelsmith"]
    out["vs_eager"] = med["eager"] / med["kernelsmith"]
    out["vs_best"] = min(med["eager"], med["inductor"]) / med["kernelsmith"]
    out["inductor_vs_eager"] = med["eager"] / med["inductor"]
    out.update(problem_floor(path, device, min(med["eager"], med["inductor"])))
    return out


def problem_floor(path: str, device: str, best_ms: float) -> dict[str, Any]:
    """The whole problem's floor at the rates measured here, and its faster baseline's share of it."""
    import torch

    from ks_inductor.judge import timing as T
    from ks_inductor.judge.room import COMPUTE_OPS, compute_dtype, floor_ms, tf32_rate
    from ks_inductor.problem_tracing import problem_from_source

    problem = problem_from_source(Path(path).read_text(), name=Path(path).stem)
    if device == "cpu":
        return {"floor_ms": None}
    bw = T.measure_copy_bandwidth(device, 512 * 2**20)
    rate = (T.measure_matmul_peak(device, getattr(torch, compute_dtype(problem.dtypes)), tf32=tf32_rate(problem))
            if problem.op_summary.keys() & COMPUTE_OPS else None)
    floor, bound = floor_ms(problem, bw, rate)
    return {"floor_ms": floor, "bound": bound, "bytes_moved": problem.bytes_moved, "flops": problem.flops,
            "bandwidth": bw, "flops_rate": rate, "best_of_floor": floor / best_ms if floor else None}


# ----------------------------------------------------------------------------------------- driver


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernelbench")
    ap.add_argument("problems", help="comma-separated LEVEL/ID, e.g. 1/19,2/12")
    ap.add_argument("tag")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per region for warm")
    ap.add_argument("--max-mib", type=float, default=None, help="shrink problems to fit M MiB (default: own sizes)")
    ap.add_argument("--phase", choices=("both", "warm", "measure"), default="both")
    ap.add_argument("--db", help="with --phase measure: the database an earlier warm left")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="triton-cuda")
    ap.add_argument("--parallel", type=int, default=None, help="regions searched at once (warm --parallel-regions)")
    ap.add_argument("--total-time", type=float, default=None, help="seconds for the whole warm")
    ap.add_argument("--measure-timeout", type=float, default=300.0, help="seconds per problem's measurement")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # child mode: PATH DB
    a = ap.parse_args()
    if a.measure:
        path, db = a.measure.split("::", 1)
        print(json.dumps(measure(path, db, a.rounds, "cpu" if a.backend == "triton-interpret" else "cuda")))
        return
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    db_file = Path(a.db) if a.db else out_dir / f"kernelbench-compile-{a.tag}.db"
    if a.db and a.phase == "measure":
        # The earlier warm's database is read-only where it came back from; measure against a copy, made through
        # SQLite so that what its write-ahead log still holds comes along.
        db_file = out_dir / f"kernelbench-compile-{a.tag}.db"
        src, dst = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True), sqlite3.connect(db_file)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
    db = f"sqlite:///{db_file}"
    root = Path(a.kernelbench).expanduser()
    root = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    work = Path(tempfile.mkdtemp(prefix="ks-kb-"))
    rows = []
    result_file = out_dir / f"kernelbench-compile-{a.tag}.json"
    files = []
    for spec in a.problems.split(","):
        level, pid = (int(x) for x in spec.split("/"))
        src_file = next((root / f"level{level}").glob(f"{pid}_*.py"))
        source, consts = (shrink(src_file.read_text(), int(a.max_mib * 2**20)) if a.max_mib else
                          (src_file.read_text(), {}))
        f = work / f"l{level}_{src_file.name}"
        f.write_text(source)
        files.append(f)
        rows.append({"problem": f"level{level}/{src_file.name}", "sizes": consts})

    # Warm as a user warms a folder of models: one `kernelsmith warm --kernelbench DIR`, its regions searched several
    # at once over every local GPU by one judge (whose per-device lock keeps timings alone on their device). Then
    # each problem is measured by itself on one GPU, up to one problem per GPU at a time.
    warm_file = out_dir / f"kernelbench-compile-{a.tag}-warm.json"
    if a.phase == "measure":
        # The warm's summary, where it was left beside its database (or here); without it rows carry no warm items.
        found = [f for f in (warm_file, Path(a.db or ".").parent / warm_file.name) if f.exists()]
        warm = json.loads(found[0].read_text()) if found else {"items": []}
    else:
        warm = run_warm(a, work, db)
        warm_file.write_text(json.dumps(warm, indent=1))
        if a.phase == "warm":
            return
    by_key = {i["key"]: i for i in warm["items"]}
    measure_all(a, rows, files, warm, by_key, db, db_file, result_file)


def run_warm(a: argparse.Namespace, work: Path, db: str) -> dict[str, Any]:
    args = ["warm", "--kernelbench", str(work), "--budget", str(a.budget), "--db", db, "--backend", a.backend,
            "--json"]
    if a.time_limit:
        args += ["--time-limit", str(a.time_limit)]
    if a.total_time:
        args += ["--total-time", str(a.total_time)]
    if a.parallel:
        args += ["--parallel-regions", str(a.parallel)]
    rc, so, se, wall = _cli(args, timeout=(a.total_time or 1500) + 300)
    warm: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 1), "stderr_tail": se.strip().splitlines()[-5:]}
    try:
        summary = json.loads(so.strip().splitlines()[-1])
        warm["items"] = [{k: i.get(k) for k in ("key", "name", "status", "judged", "accepted", "best_speedup",
                                                 "note", "wall_s", "room", "time_limit_s")}
                         for i in summary["items"]]
        warm["summary_wall_s"] = summary.get("wall_s")
        warm["gpu_util"] = summary.get("gpu_util")
    except (ValueError, IndexError, KeyError):
        warm["items"] = []
    print(json.dumps({"warm_rc": rc, "warm_wall_s": warm["wall_s"], "regions": len(warm["items"])}), flush=True)
    return warm


def measure_all(a: argparse.Namespace, rows: list[dict[str, Any]], files: list[Path], warm: dict[str, Any],
                by_key: dict[str, Any], db: str, db_file: Path, result_file: Path) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    devices = _devices(a.backend)
    free: list[str] = list(devices)
    cond = threading.Condition()

    def measure_one(job: tuple[dict[str, Any], Path]) -> None:
        row, f = job
        with cond:
            while not free:
                cond.wait()
            dev = free.pop()
        env = dict(os.environ)
        if dev != "cpu":
            env["CUDA_VISIBLE_DEVICES"] = dev
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, a.kernelbench, "-", a.tag, "--rounds", str(a.rounds),
                                "--backend", a.backend, "--measure", f"{f}::{db}"], capture_output=True, text=True,
                               timeout=a.measure_timeout, env=env)
            row["measure"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
                "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
            row["measure"] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            with cond:
                free.append(dev)
                cond.notify()
        row["measure_wall_s"] = round(time.time() - t0, 1)
        row["gpu"] = dev
        keys = row["measure"].get("keys", [])
        row["warm"] = [by_key[k] for k in keys if k in by_key]
        row["seeds"] = inductor_seed_verdicts(str(db_file), keys)
        print(json.dumps({"problem": row["problem"], "measure": row["measure"]})[:400], flush=True)
        with cond:
            result_file.write_text(json.dumps({"warm": warm, "rows": rows, "summary": summarize(rows)}, indent=1))

    with ThreadPoolExecutor(len(devices)) as pool:
        list(pool.map(measure_one, zip(rows, files)))
    result_file.write_text(json.dumps({"warm": warm, "rows": rows, "summary": summarize(rows),
                                       "command": " ".join(sys.argv), "environment": _env()}, indent=1))


def _devices(backend: str) -> list[str]:
    if backend == "triton-interpret":
        return ["cpu"]
    import torch

    return [str(i) for i in range(max(1, torch.cuda.device_count()))]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    seeded = [r for r in rows if any(s["inductor_seeds"] for s in r.get("seeds", {}).values())]
    correct = [r for r in seeded if all(s["inductor_correct"] for s in r["seeds"].values() if s["inductor_seeds"])]
    timed = [r for r in rows if "vs_inductor" in r.get("measure", {})]
    ratios = [r["measure"]["vs_inductor"] for r in timed]
    best = [r["measure"]["vs_best"] for r in timed]
    # Problems with room: the faster of eager and Inductor under 70% of the floor.
    roomy = [r["measure"]["vs_best"] for r in timed if (r["measure"].get("best_of_floor") or 1.0) < 0.7]
    return {
        "problems": len(rows),
        "measured": len(timed),
        "below_0.98x_best": sum(1 for x in best if x < 0.98),
        "geomean_vs_best": math.exp(sum(math.log(x) for x in best) / len(best)) if best else None,
        "with_room_under_70pct": len(roomy),
        "with_room_at_1.1x_best": sum(1 for x in roomy if x >= 1.1),
        "regions_settled": sum(1 for i in (r.get("warm") or [] for r in rows) for j in i
                               if j.get("status") == "settled"),
        "with_inductor_seed": len(seeded),
        "inductor_seed_correct": len(correct),
        "served_any_region": sum(1 for r in timed if r["measure"]["served"] > 0),
        "at_least_1.05x_inductor": sum(1 for x in ratios if x >= 1.05),
        "slower_than_inductor_below_0.97x": sum(1 for x in ratios if x < 0.97),
        "geomean_vs_inductor": math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None,
        "all_correct": all(r["measure"]["kernelsmith"]["correct"] for r in timed),
    }


def _env() -> dict[str, str]:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}


if __name__ == "__main__":
    main()
