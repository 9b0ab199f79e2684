"""Never slower than Inductor with nothing served: one transformers decoder layer nobody tuned kernels for, compiled
with ``backend="inductor"`` and with ``backend="kernelsmith"`` against an empty kernel cache, timed in one process.

Models (random weights, built from a config, nothing downloaded): Qwen2 (hidden 2048, intermediate 11008, 16 heads,
2 KV heads, biased q/k/v) and Phi-3 (hidden 3072, intermediate 8192, 32 heads, fused qkv and gate/up
projections), one ``DecoderLayer`` each, bf16, transformers' own code with its SDPA attention. Shapes: a prefill
(1 x 2048 tokens, causal) and a decode step (16 sequences x 1 token over 2048 cached keys and values, handed to the
layer as a cache object that appends the step's keys without storing them, so every call is the same step).

Per model and shape, three compiles of copies of the layer: Inductor, kernelsmith, and Inductor again (two compiles
of the same graph: the yardstick for any ratio near 1). Inductor's caches start empty (``TORCHINDUCTOR_CACHE_DIR``
in a fresh folder); a kernelsmith compile that hands Inductor the very graph and config Inductor compiled hits its
FX graph cache, so the compile rows' cache counters, and the generated code compared line by line (``same_code``),
show the graph is Inductor's own. Then the three are timed through their ``torch.compile`` wrappers as a user calls
them: ``--repeats`` interleaved rounds of ``triton.testing.do_bench`` (median ms, L2 flushed between calls; the
order shuffled per round), and back-to-back batches without flushes, where the host's launch cost counts
(``ks_inductor.compiler.graph_guard.interleaved_batches``, with the judge's paired bootstrap bound on the ratio).

With ``--warm SECONDS``, each case's regions are first searched into the cache (``kernelsmith warm`` of the layer
at the case's inputs, ``--budget`` judgments a region, the whole warm within SECONDS), and kernelsmith compiles
against that warmed cache: the "never slower" half, where the backend keeps its swaps only where its graph guard
times the swapped graph faster than Inductor's (``ks_inductor.compiler.graph_guard``).

``ratio`` is Inductor's ms over kernelsmith's (above 1: kernelsmith faster): per round, and their median, min and
max. ``within_2pct``: the median ratio is at least 0.98. ``ok``: every case within 2%, and every kernelsmith compile
served nothing (with ``--db`` naming a warmed cache, or ``--warm``, swaps may be served; the rule is then "never
slower": within the same 2%).

    python -m benchmarks.gpu.inductor_floor --out $OUT/floor.json
    python -m benchmarks.gpu.inductor_floor --models qwen2 --warm 150 --out $OUT/floor_warm.json
    python -m benchmarks.gpu.inductor_floor --device cpu --tiny --out floor.json   # toy sizes, a CPU smoke run
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results import spread  # noqa: E402 - importable once the checkout is on the path

# name -> (transformers config class, its sizes): a real model's layer, nobody's tuning target.
MODELS = {
    "qwen2": ("Qwen2Config", {"hidden_size": 2048, "intermediate_size": 11008, "num_attention_heads": 16,
                              "num_key_value_heads": 2}),
    "phi3": ("Phi3Config", {"hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
                            "num_key_value_heads": 32}),
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
# name -> (batch, new tokens, cached tokens)
SHAPES = {"prefill_B1_T2048": (1, 2048, 0), "decode_B16_ctx2048": (16, 1, 2048)}
TINY_SHAPES = {"prefill_B1_T16": (1, 16, 0), "decode_B2_ctx16": (2, 1, 16)}
VARIANTS = ("inductor", "kernelsmith", "inductor-repeat")


class PrefixCache:
    """The decode step's cache: the cached keys and values with the step's appended, stored nowhere, so that each
    call is the same step (transformers' caches grow by one token per call)."""

    def __init__(self, k: Any, v: Any) -> None:
        self.k, self.v = k, v

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple:
        import torch

        return torch.cat([self.k, key_states], 2), torch.cat([self.v, value_states], 2)


def build(name: str, tiny: bool, device: str, dtype: Any) -> tuple[Any, Any, Any]:
    """(the block to compile, its rotary embedding, its config)."""
    import torch
    import transformers

    cls_name, sizes = MODELS[name]
    cfg = getattr(transformers, cls_name)(**(TINY if tiny else sizes), num_hidden_layers=1, vocab_size=256,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                          max_position_embeddings=8192)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    base = model.base_model
    layer, rotary = base.layers[0], base.rotary_emb
    params = inspect.signature(layer.forward).parameters
    cache_kw = next(k for k in ("cache", "past_key_values", "past_key_value") if k in params)

    class Block(torch.nn.Module):
        """transformers' decoder layer as a model calls it, with the position embeddings computed outside."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Any, cos: Any, sin: Any, kc: Any = None, vc: Any = None) -> Any:
            cache = PrefixCache(kc, vc) if kc is not None else None
            out = self.layer(x, attention_mask=None, position_embeddings=(cos, sin), **{cache_kw: cache})
            return out[0] if isinstance(out, tuple) else out

    return Block().to(device, dtype).eval(), rotary.to(device), cfg


def inputs(cfg: Any, rotary: Any, shape: tuple[int, int, int], device: str, dtype: Any) -> tuple:
    import torch

    batch, new, cached = shape
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(batch, new, cfg.hidden_size, device=device, dtype=dtype, generator=g)
    pos = torch.arange(cached, cached + new, device=device)[None].expand(batch, new)
    cos, sin = rotary(x, pos)
    if not cached:
        return x, cos, sin
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = (batch, cfg.num_key_value_heads, cached, head_dim)
    return (x, cos, sin, torch.randn(*kv, device=device, dtype=dtype, generator=g),
            torch.randn(*kv, device=device, dtype=dtype, generator=g))


def _code(codes: list[str]) -> list[str]:
    """Inductor's generated modules, without the line that numbers the compiles of the process."""
    return [re.sub(r"^# AOT ID: .*$", "# AOT ID", c, flags=re.M) for c in codes]


def compile_variant(variant: str, block: Any, args: tuple, mode: str | None, db: str) -> tuple[Any, dict[str, Any]]:
    """A copy of ``block`` compiled by ``variant`` and called once: the compiled module and what its compile
    did (seconds, Inductor's cache counters, its generated code, kernelsmith's report)."""
    from unittest import mock

    import torch
    from torch._dynamo.utils import counters
    from torch._inductor.graph import GraphLowering

    from ks_inductor.compiler import backend as ksb

    model = copy.deepcopy(block)
    if variant == "kernelsmith":
        # A checkout run from its folder has no entry point registering the backend: registered by hand.
        import ks_inductor

        ks_inductor.register()
        # torch.compile takes mode= or options=, not both: the mode travels as a kernelsmith option
        options = {"kernelsmith.db": db, **({"kernelsmith.mode": mode} if mode else {})}
        compiled = torch.compile(model, backend="kernelsmith", options=options, dynamic=False)
    elif variant == "inductor":
        compiled = torch.compile(model, backend="inductor", mode=mode, dynamic=False)
    else:
        # Dynamo would hand this copy the first compile's code (an equal backend, the same graph): a backend of its
        # own makes it compile again, through the callable torch.compile builds for Inductor.
        inductor = torch._TorchCompileInductorWrapper(mode, None, False)

        def inductor_again(gm: Any, example_inputs: list) -> Any:
            return inductor(gm, example_inputs)

        compiled = torch.compile(model, backend=inductor_again, dynamic=False)
    before = dict(counters["inductor"])
    graphs_before = counters["stats"]["unique_graphs"]
    n_reports = len(ksb.compile_reports())
    codes: list[str] = []
    t0 = time.perf_counter()
    with torch.no_grad(), mock.patch.object(GraphLowering, "save_output_code", codes.append):
        out = compiled(*args)
    _sync()
    row: dict[str, Any] = {"compile_s": round(time.perf_counter() - t0, 2),
                           "graphs": counters["stats"]["unique_graphs"] - graphs_before}
    row["inductor_counters"] = {k: v - before.get(k, 0) for k, v in counters["inductor"].items()
                                if k.startswith(("fxgraph_cache", "autograd_cache")) and v != before.get(k, 0)}
    row["code"] = _code(codes)
    if variant == "kernelsmith":
        reports = ksb.compile_reports()[n_reports:]
        row["regions"] = sum(len([r for r in rep.regions if r.index >= 0]) for rep in reports)
        row["served"] = sum(sum(r.status in ksb.SERVED for r in rep.regions) for rep in reports)
        row["swapped"] = sum(rep.swapped for rep in reports)
        row["analysis_s"] = round(sum(rep.analysis_s for rep in reports), 3)
        row["fallback_reasons"] = [rep.fallback_reason for rep in reports if rep.fallback_reason]
    return (compiled, out), row


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_ms(fn: Any, device: str) -> float:
    """Median ms per call: ``triton.testing.do_bench`` on a GPU; a plain timer on the CPU (smoke runs)."""
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, return_mode="median"))
    for _ in range(3):
        fn()
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_case(fns: dict[str, Any], device: str, repeats: int, seed: int) -> dict[str, Any]:
    import torch

    from ks_inductor.compiler.graph_guard import GuardConfig, interleaved_batches
    from ks_inductor.judge.timing import ratio_with_lcb

    rng = random.Random(seed)
    ms: dict[str, list[float]] = {v: [] for v in fns}
    with torch.no_grad():
        for _ in range(repeats):
            order = list(fns)
            rng.shuffle(order)
            for v in order:
                ms[v].append(bench_ms(fns[v], device))
        batches = interleaved_batches(fns, device, GuardConfig(rounds=7, round_ms=20.0, budget_s=60.0), seed)
    ratios = [i / k for i, k in zip(ms["inductor"], ms["kernelsmith"])]
    yardstick = [i / r for i, r in zip(ms["inductor"], ms["inductor-repeat"])]
    b2b = {v: statistics.median(x for r in rounds for x in r) for v, rounds in batches.items()}
    b2b_ratio, b2b_lcb = ratio_with_lcb(batches["inductor"], batches["kernelsmith"])
    return {"dobench_ms": ms, "ratio": spread(ratios), "ratios": ratios, "repeat_ratio": spread(yardstick),
            "b2b_ms": b2b, "b2b_ratio": b2b_ratio, "b2b_ratio_lcb": b2b_lcb,
            "b2b_repeat_ratio": b2b["inductor"] / b2b["inductor-repeat"]}


def warm_case(block: Any, args: tuple, a: argparse.Namespace, db: str, device: str) -> dict[str, Any]:
    """Search the case's regions into ``db`` as ``kernelsmith warm`` does: what the kernelsmith compile then finds."""
    import torch

    from kernel_cache.access import open_store
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import problems_from_model, warm

    backend = "triton-cuda" if device == "cuda" else "triton-interpret"
    t0 = time.perf_counter()
    with open_store(db, create=True) as store:
        with torch.no_grad():
            problems = problems_from_model(copy.deepcopy(block), args, judge_backend=backend, store=store)
        summary = warm(problems, store, EvolveConfig(budget=a.budget, time_limit_s=a.time_per_region, backend=backend),
                       total_time_s=a.warm)
    return {"warm_s": round(time.perf_counter() - t0, 1), "regions": len(summary.items),
            "items": [{"name": i.name, "signature": i.signature, "status": i.status, "judged": i.judged,
                       "best_speedup": i.best_speedup} for i in summary.items]}


def run_case(model_name: str, shape_name: str, shape: tuple, a: argparse.Namespace, db: str, device: str,
             dtype: Any, built: tuple) -> dict[str, Any]:
    import torch

    block, rotary, cfg = built
    args = inputs(cfg, rotary, shape, device, dtype)
    row: dict[str, Any] = {"model": model_name, "shape": shape_name, "batch_new_cached": list(shape)}
    if a.warm:
        row["warm"] = warm_case(block, args, a, db, device)
    fns, outs = {}, {}
    for v in VARIANTS:
        (compiled, out), row[v] = compile_variant(v, block, args, a.mode, db)
        outs[v] = out
        fns[v] = lambda c=compiled: c(*args)
    ind, ks = row["inductor"], row["kernelsmith"]
    row["same_code"] = bool(ind["code"]) and ks["code"] == ind["code"]
    if not row["same_code"]:
        row["code_diff_lines"] = sum(1 for x, y in zip("\n".join(ind["code"]).splitlines(),
                                                       "\n".join(ks["code"]).splitlines()) if x != y)
    row["max_abs_diff"] = (outs["kernelsmith"].float() - outs["inductor"].float()).abs().max().item()
    for v in VARIANTS:
        row[v]["code_chars"] = sum(len(c) for c in row[v].pop("code"))
    row.update(time_case(fns, device, a.repeats, seed=len(shape_name)))
    empty = not (a.db or a.warm)
    row["within_2pct"] = row["ratio"]["median"] >= 0.98
    row["ok"] = row["within_2pct"] and (not empty or ks["served"] == 0)
    del fns
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default: $OUT/inductor_floor.json)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--shapes", default=None, help="comma-separated subset of the shapes")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved do_bench rounds")
    ap.add_argument("--mode", default=None, help="torch.compile mode for both backends (default: Inductor's)")
    ap.add_argument("--db", default=None, help="a kernel cache as it is (default: a fresh, empty one)")
    ap.add_argument("--warm", type=float, default=0.0, help="seconds to search each case's regions into the cache "
                    "before kernelsmith compiles against it (0: the cache as it is)")
    ap.add_argument("--budget", type=int, default=8, help="judgments a region, with --warm")
    ap.add_argument("--time-per-region", type=float, default=60.0, help="seconds a region's search, with --warm")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where there is one")
    ap.add_argument("--tiny", action="store_true", help="toy sizes and shapes (a CPU smoke run of this script)")
    a = ap.parse_args(argv)
    out = a.out or Path(os.environ.get("OUT", "."), "inductor_floor.json")
    tmp = tempfile.mkdtemp(prefix="ks-floor-")
    # Inductor's caches start empty, so that what a kernelsmith compile finds in them is what Inductor's made.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    os.environ.setdefault("KERNELSMITH_HOME", os.path.join(tmp, "home"))
    db = a.db or os.path.join(tmp, "kernels.db")
    os.environ["KERNELSMITH_DB"] = db
    import torch
    import transformers
    import triton

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        os.environ.pop("TRITON_INTERPRET", None)  # GPU kernels, not the interpreter's
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for name in ("recompile_limit", "cache_size_limit"):  # three compiles per shape of one layer's forward
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    shapes = TINY_SHAPES if a.tiny else SHAPES
    chosen = a.shapes.split(",") if a.shapes else list(shapes)
    result: dict[str, Any] = {
        "benchmark": "inductor_floor", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "dtype": str(dtype).replace("torch.", ""), "db": db,
        "cache": "warmed" if a.warm else ("given" if a.db else "empty"),
        "args": {k: str(v) for k, v in vars(a).items()}, "cases": [],
    }
    t0 = time.time()
    for model_name in a.models.split(","):
        built = build(model_name, a.tiny, device, dtype)
        for shape_name in chosen:
            try:
                row = run_case(model_name, shape_name, shapes[shape_name], a, db, device, dtype, built)
            except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
                traceback.print_exc()
                row = {"model": model_name, "shape": shape_name, "error": f"{type(e).__name__}: {e}"[:800],
                       "ok": False}
            result["cases"].append(row)
            print(json.dumps({k: row.get(k) for k in ("model", "shape", "ratio", "repeat_ratio", "b2b_ratio",
                                                       "same_code", "ok", "error")}), flush=True)
            _write(out, result)
        del built
    result["ok"] = bool(result["cases"]) and all(r.get("ok") for r in result["cases"])
    result["wall_s"] = round(time.time() - t0, 1)
    _write(out, result)
    print(f"{'ok' if result['ok'] else 'NOT ok'}: {out} ({result['wall_s']} s)")
    return 0


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
