"""Map the op-family templates' parameter spaces on a GPU: which structures reach the roofline floor.

An exploration tool for template authors, not a judge: each rendered configuration is compiled (in a pool of
processes that fill Triton's on-disk cache), checked against the problem's reference on its native inputs, and
timed with CUDA events around single calls after an L2 flush (median). Nothing goes into a kernel cache. Also timed,
as yardsticks of what the memory system gives at this size: a device copy of the op's main input (the same bytes
read and written as a norm or softmax), and eager.

Configurations are timed one after another, so for compute-bound kernels (GEMMs) the GPU's clock and power state
at each one's turn moves the numbers by several percent: on the H200 the board power climbed from 158 to 636 W and
the SM clock fell from 1848 to 1647 MHz across five GEMMs timed in turn (``timing_context.py``). Rank those with
the interleaved timing of ``evolve_serving_ops.py`` or ``timing_context.py``, not with this sweep.

    python benchmarks/gpu/sweep_templates.py $OUT/sweep.json --ops rmsnorm,softmax --per-variant 48
    python benchmarks/gpu/sweep_templates.py $OUT/sweep.json --ops gemm_gelu --per-variant 0 \
        --configs benchmarks/gpu/configs/gemm-hopper.json --peers inductor,max-autotune
    python benchmarks/gpu/sweep_templates.py $OUT/sweep.json --problem my_problem.py --kernel-times

``--kernel-times`` adds, for eager and the leaders, each kernel's device time per call from torch's profiler:
what a launch-bound region spends in kernels against what a call costs between the judge's events.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.evolve_serving_ops import OPS, PROBLEM_DIR  # noqa: E402


def _configs(fm: Any, per_variant: int, rng: random.Random, variants: set[str] | None = None,
             fix: dict[str, Any] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """Up to ``per_variant`` configurations of each template variant (``template/variant`` names in
    ``variants``, all if None), with the parameters in ``fix`` held at the given values where they exist."""
    from ks_inductor.seeds.families import templates_for

    out = []
    for t in templates_for(fm):
        for v in t.variants(fm):
            if variants and f"{t.name}/{v}" not in variants:
                continue
            space = t.space(fm, v)
            for k, val in (fix or {}).items():
                if k in space:
                    space[k] = [val]
            keys = list(space)
            combos = [dict(zip(keys, vals)) for vals in itertools.product(*(space[k] for k in keys))]
            combos = [c for c in combos if t.feasible(fm, c, v)]
            rng.shuffle(combos)
            chosen = [t.default(fm, v, "cuda")] + combos[: max(0, per_variant - 1)]
            out += [(t.name, v, p) for p in chosen]
    return out


def _listed(fm: Any, path: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Hand-picked configurations from a JSON file, ``[{"variant": "matmul/tma", "params": {...}}, ...]``, each
    over its variant's default."""
    from ks_inductor.seeds.families import configured, template_named

    out = []
    for row in json.loads(Path(path).read_text()) if path else []:
        tname, _, v = row["variant"].partition("/")
        if v in template_named(tname).variants(fm):  # the file may list variants other problems' families offer
            t, v, params = configured(fm, row["variant"], row.get("params"))
            out.append((t.name, v, params))
    return out


def _render(fm: Any, tname: str, variant: str, params: dict[str, Any]) -> str | None:
    from ks_inductor.seeds.families import TemplateError, template_named

    try:
        return template_named(tname).render(fm, params, variant)
    except TemplateError:
        return None


_PROBLEMS: dict[str, tuple[Any, Any, list[Any]]] = {}


def _problem(problem_path: str) -> tuple[Any, Any, list[Any]]:
    """The problem module, its reference model and native inputs on the GPU (made once per process)."""
    import torch

    from ks_core.problem_record import exec_problem_source

    if problem_path not in _PROBLEMS:
        pmod = exec_problem_source(Path(problem_path).read_text(), problem_path)
        torch.manual_seed(0)
        ref = pmod.Model(*pmod.get_init_inputs()).cuda().eval()
        torch.manual_seed(1)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_inputs()]
        _PROBLEMS[problem_path] = (pmod, ref, inputs)
    return _PROBLEMS[problem_path]


def _candidate(problem_path: str, source: str, workdir: str) -> Any:
    import torch

    from ks_inductor.source_module import load_source_module

    pmod, ref, _ = _problem(problem_path)
    cmod = load_source_module(source, "ks_sweep", workdir)
    torch.manual_seed(0)
    model = cmod.ModelNew(*pmod.get_init_inputs())
    state = ref.state_dict()
    if set(model.state_dict()) == set(state):
        model.load_state_dict(state)
    return model.cuda().eval()


def _warm(problem_path: str, source: str, workdir: str) -> str | None:
    """Compile in a pool process (fills Triton's disk cache for the timing process)."""
    import torch

    try:
        model = _candidate(problem_path, source, workdir)
        with torch.no_grad():
            model(*_problem(problem_path)[2])
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:300]}"


def _time(fn: Any, flush: Any, reps: int) -> float:
    """Median ms of ``reps`` single calls, each after an L2 flush (the judge's timing loop, one round)."""
    from ks_inductor.judge import timing as T

    rounds = T.benchmark_interleaved({"fn": fn}, rounds=1, warmup_ms=5.0, rep_ms=0.0, min_reps=reps,
                                     max_reps=reps, flush=flush, device="cuda")["fn"]
    return T.summarize(rounds).median_ms


def _kernel_us(fn: Any, calls: int = 50) -> dict[str, float]:
    """Device µs per call of each kernel ``fn`` launches (torch's profiler, ``calls`` calls): where a launch-bound
    call's time goes between kernels and the gaps around them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        if us:
            out[e.key[:80]] = round(us / calls, 3)
    return out


def _ok(ref_out: Any, out: Any) -> str | None:
    """Why ``out`` is wrong against the reference, by the judge's own comparison and tolerances."""
    from ks_inductor.judge import JudgeConfig
    from ks_inductor.judge.compare import compare_outputs

    as_list = (lambda o: list(o) if isinstance(o, (tuple, list)) else [o])  # noqa: E731
    return compare_outputs(as_list(ref_out), as_list(out), JudgeConfig().tolerance, 0, "native")[1]


def _peers(op: str, ref: Any, inputs: list[Any], flush: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The peers' times under the same timing loop, so a sweep says at once whether a structure can win."""
    import torch

    from benchmarks.gpu.evolve_serving_ops import _liger

    out: dict[str, Any] = {}
    fns: dict[str, Any] = {"inductor": torch.compile(ref)}
    if "max-autotune" in args.peers:
        fns["inductor_max_autotune"] = torch.compile(ref, mode="max-autotune-no-cudagraphs")
    liger = _liger(op, ref, inputs)
    for name, fn in fns.items():
        try:
            fn(*inputs)
            out[name] = _time(lambda f=fn: f(*inputs), flush, args.reps)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, the sweep goes on
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
    if liger is not None:
        try:
            liger()
            out["liger"] = _time(liger, flush, args.reps)
        except Exception as e:  # noqa: BLE001
            out["liger"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def sweep_op(op: str, args: argparse.Namespace, pool: ProcessPoolExecutor, bandwidth: float,
             deadline: float) -> dict[str, Any]:
    import torch

    from ks_inductor.judge.timing import make_l2_flush
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import classify

    path = str(PROBLEM_DIR / OPS[op]) if op in OPS else op
    problem = load_problem(path)
    fm = classify(problem)
    fm.target = "cuda"
    rng = random.Random(args.seed)
    variants = set(args.variants.split(",")) if args.variants else None
    fix = {k: int(v) for k, v in (kv.split("=") for kv in args.fix.split(",") if kv)} if args.fix else None
    rows = []
    chosen = _configs(fm, args.per_variant, rng, variants, fix) if args.per_variant > 0 else []
    chosen += _listed(fm, args.configs)
    for tname, variant, params in chosen:
        src = _render(fm, tname, variant, params)
        if src is not None:
            rows.append({"template": tname, "variant": variant, "params": params, "source": src})
    workdir = os.path.join(args.workdir, Path(op).stem)
    futs = {pool.submit(_warm, path, r["source"], workdir): r for r in rows}
    try:
        # One compile that hangs (the warp-specialization pass has) must not hold every timing past the deadline.
        compile_by = min(deadline, time.time() + args.compile_timeout)
        for f in as_completed(futs, timeout=max(1.0, compile_by - time.time())):
            try:
                futs[f]["compile_error"] = f.result()
            except Exception as e:  # noqa: BLE001 - a dead pool process
                futs[f]["compile_error"] = f"{type(e).__name__}: {e}"
    except TimeoutError:  # the deadline: what has not compiled by now is not timed
        for f, r in futs.items():
            if not f.done():
                f.cancel()
                r["compile_error"] = "not compiled in time"
    flush = make_l2_flush("cuda")
    _, ref, inputs = _problem(path)
    with torch.no_grad():
        ref_out = ref(*inputs)
        eager_ms = _time(lambda: ref(*inputs), flush, args.reps)
        main = max((x for x in inputs if isinstance(x, torch.Tensor)), key=lambda t: t.numel())
        dst = torch.empty_like(main)
        copy_ms = _time(lambda: dst.copy_(main), flush, args.reps)
        peers_ms = _peers(op, ref, inputs, flush, args) if args.peers else {}
        for r in rows:
            src = r.pop("source")
            if r.get("compile_error"):
                continue
            if time.time() > deadline:
                r["skipped"] = "deadline"
                continue
            try:
                model = _candidate(path, src, workdir)
                bad = _ok(ref_out, model(*inputs))
                if bad:
                    r["wrong"] = bad
                    continue
                r["ms"] = _time(lambda m=model: m(*inputs), flush, args.reps)
                r["_model"] = model
            except Exception as e:  # noqa: BLE001
                r["run_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    floor_ms = problem.bytes_moved / bandwidth * 1e3 if problem.bytes_moved else None
    timed = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    import triton.testing

    with torch.no_grad():
        for r in timed[:5]:
            # A second opinion on the leaders from Triton's own harness (it clears L2 its own way).
            r["do_bench_ms"] = triton.testing.do_bench(lambda m=r["_model"]: m(*inputs), return_mode="median")
        eager_kernels = _kernel_us(lambda: ref(*inputs)) if args.kernel_times else None
        if args.kernel_times:
            for r in timed[:8]:
                r["kernel_us"] = _kernel_us(lambda m=r["_model"]: m(*inputs))
    for r in rows:
        r.pop("_model", None)
    for r in timed:
        r["frac_floor"] = floor_ms / r["ms"] if floor_ms else None
    return {"floor_ms": floor_ms, "eager_ms": eager_ms, "eager_kernel_us": eager_kernels,
            "copy_main_input_ms": copy_ms, "peers_ms": peers_ms,
            "copy_bytes": 2 * main.numel() * main.element_size(), "configs": len(rows), "timed": len(timed),
            "best": timed[:15], "failed": [r for r in rows if "ms" not in r][:40],
            "all": [[r["template"], r["variant"], r["params"], round(r["ms"] * 1e3, 2)] for r in timed]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--problem", action="append", default=[],
                    help="a problem file to sweep as well (or only, with --ops ''); may repeat")
    ap.add_argument("--kernel-times", action="store_true", help="each kernel's device time per call (profiler)")
    ap.add_argument("--per-variant", type=int, default=40)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole sweep")
    ap.add_argument("--compile-timeout", type=float, default=240.0, help="seconds for all compiles of one op")
    ap.add_argument("--workdir", default="/tmp/ks-sweep")
    ap.add_argument("--variants", default="", help="only these template/variant names, comma-separated")
    ap.add_argument("--fix", default="", help="hold parameters, e.g. RND=1,LOWP=0")
    ap.add_argument("--configs", default="", help="JSON file of hand-picked configurations to add (--per-variant 0: "
                    "only those)")
    ap.add_argument("--peers", default="", help="also time peers: inductor[,max-autotune] (Liger where it has the op)")
    args = ap.parse_args()

    import multiprocessing as mp

    import torch
    import triton

    from ks_inductor.judge.timing import measure_copy_bandwidth

    t0 = time.time()
    deadline = t0 + args.deadline
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "ops": {}}
    bw = measure_copy_bandwidth("cuda")
    res["copy_GBps"] = bw / 1e9
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for op in [o for o in args.ops.split(",") if o] + args.problem:
            if time.time() > deadline:
                res["ops"][op] = {"skipped": "deadline"}
                continue
            try:
                res["ops"][op] = sweep_op(op, args, pool, bw, deadline)
                b = res["ops"][op]["best"]
                print(f"[{op}] {res['ops'][op]['timed']}/{res['ops'][op]['configs']} timed; best "
                      f"{b[0]['ms'] * 1e3:.1f} us {b[0]['template']}/{b[0]['variant']} {b[0]['params']} "
                      f"({100 * (b[0]['frac_floor'] or 0):.0f}% floor); copy "
                      f"{res['ops'][op]['copy_main_input_ms'] * 1e3:.1f} us; peers {res['ops'][op]['peers_ms']}"
                      if b else f"[{op}] nothing timed",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                res["ops"][op] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                print(f"[{op}] FAILED {e}", flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    res["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
