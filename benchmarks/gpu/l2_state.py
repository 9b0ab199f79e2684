"""Does the L2's state before a timed call decide a memory-bound kernel's time? Three protocols, side by side.

- ``dirty``: before every call a buffer of at least twice the L2 is zeroed (the judge's flush until 2026-11-22),
  which evicts the call's data but leaves the L2 full of the flush's dirty lines; the timed call pays for writing
  them back.
- ``clean``: the same, then a read sweep over a second buffer as large, so those write-backs happen untimed and
  the call starts with an L2 of clean lines that hold none of its data (the judge's flush now).
- ``stream``: no flush. Input sets that together exceed four times the L2 run back to back inside one CUDA graph,
  so every call's inputs are cold and no launch gap separates calls; time per call is the replay's time over the
  calls in it. That is how a model's CUDA graph runs them.

Subjects: device copies from 8 MiB to 1 GiB, and the serving ops of ``evolve_serving_ops.py`` with eager,
Inductor (and its max-autotune build, with ``--max-autotune``), Liger and the kernelsmith winners whose sources the
given result files hold. All tools of a subject and protocol are timed interleaved in shuffled rounds. The floor is
the op's bytes over the 2 GiB copy's bandwidth.

    python benchmarks/gpu/l2_state.py $OUT/l2.json --sources benchmarks/results/evolve-serving-ops-X.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.evolve_serving_ops import OPS, PROBLEM_DIR, _cycled, _import_file, _liger, input_sets  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402

MEMORY_OPS = ("rmsnorm", "layernorm", "softmax", "silu_mul", "rope", "cross_entropy")
PROTOCOLS = ("dirty", "clean", "stream")


def _per_call(tools: dict[str, list[Callable[[], Any]]], flush: Callable[[], None], rounds: int,
              rep_ms: float) -> dict[str, float]:
    fns = {name: _cycled(calls) for name, calls in tools.items()}
    samples = T.benchmark_interleaved(fns, rounds=rounds, rep_ms=rep_ms, flush=flush)
    return {name: T.summarize(s).median_ms for name, s in samples.items()}


def _measure(tools: dict[str, list[Callable[[], Any]]], args: argparse.Namespace,
             flushes: dict[str, Callable[[], None]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for proto in args.protocols:
        if proto == "stream":
            samples, errors = T.benchmark_graphed(tools, rounds=args.rounds)
            ms = {name: T.summarize(v).median_ms for name, v in samples.items()}
            if errors:
                out["stream_errors"] = errors
        else:
            ms = _per_call(tools, flushes[proto], args.rounds, args.rep_ms)
        out[proto] = ms
    return out


def _copies(sizes_mib: list[int], l2: int, bandwidth: float, args: argparse.Namespace,
            flushes: dict[str, Callable[[], None]]) -> dict[str, Any]:
    import torch

    res: dict[str, Any] = {}
    for mib in sizes_mib:
        n = mib * 2**20
        pairs = [(torch.randint(0, 100, (n // 2,), dtype=torch.int16, device="cuda"),
                  torch.empty(n // 2, dtype=torch.int16, device="cuda")) for _ in range(T.cold_set_count(n, l2))]
        tools = {"copy": [(lambda a=a, b=b: b.copy_(a)) for a, b in pairs]}
        row = _measure(tools, args, flushes)
        row["bytes_moved"] = 2 * n
        row["floor_ms"] = 2 * n / bandwidth * 1e3
        res[f"{mib}MiB"] = row
        del pairs, tools
        torch.cuda.empty_cache()
        print(f"copy {mib:5d} MiB: " + ", ".join(
            f"{p} {row[p]['copy'] * 1e3:.1f} us ({row['floor_ms'] / row[p]['copy']:.0%})" for p in args.protocols),
            flush=True)
    return res


def _op(op: str, source: str | None, bandwidth: float, args: argparse.Namespace,
        flushes: dict[str, Callable[[], None]]) -> dict[str, Any]:
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEM_DIR / OPS[op])
    pm = exec_problem_source(problem.source)
    torch.manual_seed(0)
    model = pm.Model(*pm.get_init_inputs()).cuda().eval()
    sets = input_sets(pm, 0)
    first = sets[0]
    tools: dict[str, list[Callable[[], Any]]] = {"eager": [(lambda s=s: model(*s)) for s in sets]}
    row: dict[str, Any] = {"bytes_moved": problem.bytes_moved, "floor_ms": problem.bytes_moved / bandwidth * 1e3,
                           "input_sets": len(sets)}
    with torch.no_grad():
        ind = torch.compile(model)
        ind(*first)
        tools["inductor"] = [(lambda s=s: ind(*s)) for s in sets]
        if args.max_autotune:
            mx = torch.compile(model, mode="max-autotune-no-cudagraphs")
            mx(*first)
            tools["inductor_max_autotune"] = [(lambda s=s: mx(*s)) for s in sets]
        ligs = [_liger(op, model, s) for s in sets]
        if all(callable(f) for f in ligs):
            tools["liger"] = ligs
        if source is not None:
            path = Path(args.workdir) / f"best_{op}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
            best = _import_file(str(path), f"ks_l2_{op}").ModelNew(*pm.get_init_inputs())
            best.load_state_dict(model.state_dict(), strict=False)
            best = best.cuda().eval()
            tools["kernelsmith"] = [(lambda s=s: best(*s)) for s in sets]
        for i, raw in enumerate(args.config.get(op, [])):
            spec = json.loads(raw)
            model_i = _configured(problem, pm, model, spec, Path(args.workdir) / f"{op}_{i}")
            tools[f"ks:{spec['variant']}:{json.dumps(spec.get('params', {}), sort_keys=True)}"] = [
                (lambda s=s, m=model_i: m(*s)) for s in sets]
        for calls in tools.values():
            calls[0]()
        torch.cuda.synchronize()
        row.update(_measure(tools, args, flushes))
    for p in args.protocols:
        line = ", ".join(f"{k} {v * 1e3:.1f} us ({row['floor_ms'] / v:.0%})" for k, v in row[p].items())
        print(f"{op:13s} {p:6s}: {line}", flush=True)
    return row


def _configured(problem: Problem, pm: Any, ref: Any, spec: dict[str, Any], workdir: Path) -> Any:
    """A template configuration rendered for the GPU, with the reference's parameters."""
    import torch

    from ks_inductor.seeds.families import classify, configured
    from ks_inductor.source_module import load_source_module

    fm = classify(problem)
    fm.target = "cuda"
    t, variant, params = configured(fm, spec["variant"], spec.get("params"))
    source = t.render(fm, params, variant)
    model = load_source_module(source, "ks_l2_cfg", str(workdir)).ModelNew(*pm.get_init_inputs())
    model.load_state_dict(ref.state_dict(), strict=False)
    return model.to(torch.device("cuda")).eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ops", default=",".join(MEMORY_OPS))
    ap.add_argument("--sources", default="", help="comma-separated evolve_serving_ops result files (later wins)")
    ap.add_argument("--copy-mib", default="8,16,32,64,128,256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep-ms", type=float, default=60.0)
    ap.add_argument("--workdir", default="/tmp/ks-l2-state")
    ap.add_argument("--config", action="append", default=[],
                    help='OP:{"variant": "template/variant", "params": {...}}, timed with the op; repeatable')
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--max-autotune", action="store_true", help="also time Inductor's max-autotune build")
    args = ap.parse_args()
    configs: dict[str, list[str]] = {}
    for c in args.config:
        op, _, raw = c.partition(":")
        configs.setdefault(op, []).append(raw)
    args.config = configs
    args.protocols = [p for p in args.protocols.split(",") if p in PROTOCOLS]

    import torch
    import triton

    sources: dict[str, str] = {}
    for f in [f for f in args.sources.split(",") if f]:
        for op, row in json.loads(Path(f).read_text()).get("ops", {}).items():
            if row.get("best_source"):
                sources[op] = row["best_source"]
    l2 = T.device_l2_bytes()
    bandwidth = T.measure_copy_bandwidth("cuda")
    flushes = {"dirty": T.make_l2_flush("cuda", clean=False), "clean": T.make_l2_flush("cuda")}
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "l2_bytes": l2, "copy_GBps": bandwidth / 1e9,
                           "protocols": args.protocols, "copies": {}, "ops": {}}
    t0 = time.time()
    out = Path(args.out)
    res["copies"] = _copies([int(x) for x in args.copy_mib.split(",") if x], l2, bandwidth, args, flushes)
    out.write_text(json.dumps(res, indent=1))
    for op in [o for o in args.ops.split(",") if o]:
        try:
            res["ops"][op] = _op(op, sources.get(op), bandwidth, args, flushes)
        except Exception as e:  # noqa: BLE001 - one op failing must not lose the others
            res["ops"][op] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"{op}: FAILED {res['ops'][op]['error']}", flush=True)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        res["total_s"] = time.time() - t0
        out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
