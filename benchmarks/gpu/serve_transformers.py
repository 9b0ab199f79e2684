"""transformers ``generate()`` of a Llama-style model (random weights) three ways in one process, on one GPU: its
own layers, a kernelsmith pack, and Liger-Kernel's ``apply_liger_kernel_to_llama``.

The pack is built by ``integrations.transformers.pack_for_model`` for the deployment's shapes, recorded from a
short ``generate()`` (the prefill of ``--prompt`` tokens and the decode step, at ``--batch``), searched against the
model's own layers (what transformers runs), then served by ``apply_kernelsmith`` on a copy of the model, applied
once as a server applies it. Its first generation, which proves each kernel (and each new cache length of the
attention) on first use, is reported apart. While the served copy lives, the model file's rotary function and the
``sdpa`` attention entry are bound to kernelsmith's dispatchers, which the own copy's calls pass through to
transformers' functions. Reported: greedy tokens per second each way (the median of ``--repeats`` runs, the three
interleaved), the largest prefill logit difference
against the model's own, the share of logits within the judge's bf16 tolerance and the judge's verdict on them by its
own rule (against the model's own logits, with the float64 model's as the judge's truth), how many generated tokens agree,
the guard's counters and races, and one layer of each swapped kind timed per call at the decode step each way.

    python benchmarks/gpu/serve_transformers.py --out $OUT/serve_transformers.json
    python benchmarks/gpu/serve_transformers.py --merge run1.json run2.json run3.json --out serve.json

``--merge`` folds runs (each a pack build and its measurement) into one file: the spread of pack vs own and vs
Liger across them, and each op's verdicts run by run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timed_generate(model, ids, new: int) -> tuple[float, object]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _per_call_us(fn, n: int = 100, batches: int = 7) -> float:
    """Wall µs per call, the device synchronized around each batch of calls (the median batch): the host's
    dispatch and launch cost counts, as it does in eager decoding."""
    import torch

    got = []
    with torch.no_grad():
        for _ in range(20):
            fn()
        for _ in range(batches):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            got.append((time.perf_counter() - t0) * 1e6 / n)
    return statistics.median(got)


def _layer_calls(model, args) -> dict:
    """One norm, one MLP and one attention layer at the decode step, as callables."""
    import torch

    layer = model.model.layers[0]
    x = torch.randn(args.batch, 1, args.hidden, device="cuda", dtype=torch.bfloat16)
    pos = torch.full((args.batch, 1), args.prompt, device="cuda", dtype=torch.long)
    cos, sin = model.model.rotary_emb(x, pos)
    return {"rmsnorm": lambda: layer.post_attention_layernorm(x), "mlp": lambda: layer.mlp(x),
            "attention": lambda: layer.self_attn(hidden_states=x, position_embeddings=(cos, sin),
                                                 attention_mask=None)}


def _judged(got, want, truth) -> str:
    """The judge's verdict on prefill logits, by its own rule for a bfloat16 output: within its tolerance of the
    model's own logits, or no further from the float64 model's than the model's own are (``compare_outputs``).
    Empty where they pass, else the judge's reason."""
    from ks_inductor.judge.compare import compare_outputs
    from ks_inductor.judge.config import JudgeConfig

    _, why = compare_outputs([want.cpu()], [got.cpu()], JudgeConfig().tolerance, 0, "native",
                             truth=[truth.float().cpu()])
    return why or ""


def _tolerance_share(got, want) -> float:
    from ks_inductor.judge.config import JudgeConfig

    atol, rtol = JudgeConfig().tolerance("bfloat16")
    return float(((got - want).abs() <= atol + rtol * want.abs()).float().mean())


def merge_runs(runs: list[dict], about: str = "") -> dict:
    """Runs of this benchmark as one result: the versions and device they share, what they were (``about``), the
    spread of the pack's ratios, and per op and input signature, each run's verdict on its best kernel, whether it
    was packed, and its speedup over eager."""
    from benchmarks.results import spread

    first = runs[0]
    ops: dict[str, dict] = {}
    for run in runs:
        for prob in run.get("problems", []):
            row = ops.setdefault(f"{prob['name']} {prob['inputs']}",
                                 {"statuses": [], "packed": [], "speedups": [], "graph": []})
            best = (prob.get("kernels") or [{}])[0]
            row["statuses"].append(best.get("status"))
            row["packed"].append(prob.get("packed"))
            row["speedups"].append(best.get("speedup_eager"))
            row["graph"].append(best.get("speedup_graph"))
    for row in ops.values():
        row["speedup_eager"] = spread(row.pop("speedups"))
        row["speedup_graph"] = spread(row.pop("graph"))
    return {**{k: first.get(k) for k in ("device", "torch", "triton", "transformers")},
            **({"about": about} if about else {}),
            "pack_vs_own": spread([r.get("pack_vs_own") for r in runs]),
            "pack_vs_liger": spread([r.get("pack_vs_liger") for r in runs]),
            "per_op_verdicts": ops, "runs": runs}


def main() -> int:
    if "--merge" in sys.argv:
        m = argparse.ArgumentParser()
        m.add_argument("--merge", nargs="+", required=True)
        m.add_argument("--out", required=True)
        m.add_argument("--about", default="")
        a = m.parse_args()
        merged = merge_runs([json.loads(Path(f).read_text()) for f in a.merge], a.about)
        Path(a.out).write_text(json.dumps(merged, indent=1, default=str))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--budget", type=int, default=10)
    p.add_argument("--time-per-op", type=float, default=90.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--db", default=None, help="a kernel cache to warm (default: a fresh one)")
    p.add_argument("--out", default="serve_transformers.json")
    p.add_argument("--work", default=None, help="where the build leaves its pack for the measurement")
    p.add_argument("--phase", choices=("all", "build", "measure"), default="all")
    args = p.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="ks-serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.phase == "all":
        # The build's judge and its workers end with its process: the measurement runs on a quiet host.
        import subprocess

        base = [sys.executable, __file__, *sys.argv[1:], "--work", str(work)]
        subprocess.run([*base, "--phase", "build"], check=True)
        subprocess.run([*base, "--phase", "measure"], check=True)
        return 0

    import torch
    import transformers
    from rich.console import Console
    from transformers import LlamaConfig, LlamaForCausalLM

    from integrations.transformers import pack_for_model
    from ks_inductor.evolve import EvolveConfig

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.prompt + args.new + 8)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight"):
                prm.add_(0.1 * torch.randn_like(prm))
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": __import__("triton").__version__, "transformers": transformers.__version__,
                    "args": vars(args)}

    db = args.db or str(work / "k.db")
    if args.phase == "measure":
        return _measure(args, model, ids, work, json.loads((work / "build.json").read_text()))
    t0 = time.perf_counter()
    build = pack_for_model(model, [lambda m: m.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False,
                                                        pad_token_id=0)],
                           work / "llama.kspack", db=db,
                           config=EvolveConfig(budget=args.budget, time_limit_s=args.time_per_op,
                                               backend="triton-cuda"),
                           console=Console(stderr=True))
    result["pack_build_s"] = time.perf_counter() - t0
    items = {i.key: i for i in build.warm.items}
    from kernel_cache.access import open_store

    result["problems"] = []
    with open_store(db) as store:
        for prob in build.problems:
            ks = store.kernels(problem_key=prob.key)
            result["problems"].append({
                "name": prob.name, "inputs": prob.signature(), "packed": prob.key not in build.missing,
                "status": getattr(items.get(prob.key), "status", None),
                "why_missing": build.why_missing(prob.key),
                "kernels": [{"status": k.status, "speedup_eager": k.speedup_eager, "median_ms": k.median_ms,
                             "eager_ms": k.eager_ms, "speedup_inductor": k.speedup_inductor,
                             "speedup_lcb": k.speedup_lcb, "speedup_graph": k.speedup_graph} for k in ks[:2]]})

    result["pack"] = str(work / "llama.kspack") if build.export is not None else None
    (work / "build.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


def _measure(args, model, ids, work: Path, result: dict) -> int:
    import copy
    import os

    import torch
    import transformers.models.llama.modeling_llama as ml

    from integrations.transformers import apply_kernelsmith

    result["loadavg_before_measure"] = os.getloadavg()
    pack = Path(result["pack"]) if result.get("pack") else work / "none"
    with torch.no_grad():
        base_logits = model(ids).logits
        wide = copy.deepcopy(model).to(torch.float64)
        truth_logits = wide(ids).logits
        del wide
    calls = _layer_calls(model, args)
    per_call: dict = {"own": {k: _per_call_us(f) for k, f in calls.items()}}

    # Three copies of one model take turns: its own layers, Liger's, and the pack's, applied once as a server
    # would. Liger binds its rotary function in the model file, so that binding is made only while its copy runs,
    # over whatever is bound there (the pack's dispatcher while the pack's copy is served).
    served_model = copy.deepcopy(model)
    liger_model, liger_rope = None, None
    own_rope = ml.apply_rotary_pos_emb
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        liger_model = copy.deepcopy(model)
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, model=liger_model)
        liger_rope = ml.apply_rotary_pos_emb
    except Exception as e:  # noqa: BLE001 - a missing or incompatible Liger is reported, not fatal
        result["liger_error"] = f"{type(e).__name__}: {e}"
    finally:
        ml.apply_rotary_pos_emb = own_rope

    def liger_run(fn):
        bound = ml.apply_rotary_pos_emb
        ml.apply_rotary_pos_emb = liger_rope
        try:
            return fn()
        finally:
            ml.apply_rotary_pos_emb = bound

    report = apply_kernelsmith(served_model, pack)
    result["swapped"] = len(report.swapped)
    result["refused"] = report.refused
    # The first generation proves, races and plans each kernel on first use, and each new cache length of the
    # attention: its time is reported apart from the steady state.
    result["pack_first_generate_s"] = _timed_generate(served_model, ids, args.new)[0]
    with torch.no_grad():
        pack_logits = served_model(ids).logits
    per_call["pack"] = {k: _per_call_us(f) for k, f in _layer_calls(served_model, args).items()}
    # Where a served norm's time goes: the kernel as judged, its launch plan, then the layer.
    norm = served_model.model.layers[0].post_attention_layernorm
    x1 = torch.randn(args.batch, 1, args.hidden, device="cuda", dtype=torch.bfloat16)
    served = next((op for op in report.guard.kernels.values() for op in op if op.state == "passed"
                   and list(op.problem.input_specs[0].shape) == [args.batch, 1, args.hidden]), None) \
        if report.guard is not None else None
    if served is not None:
        w = norm.weight
        per_call["norm_breakdown"] = {
            # as judged, without a launch plan: its judged plan run step by step
            "kernel_judged": _per_call_us(lambda: served.judged_call(x1, w)),
            "kernel_plan": _per_call_us(lambda: served.plan(x1, w)) if served.plan is not None else None,
            "layer": _per_call_us(lambda: norm(x1)),
            "torch_empty": _per_call_us(lambda: torch.empty_like(x1)),
            "torch_add": _per_call_us(lambda: x1 + x1),
        }

    if liger_model is not None:
        with torch.no_grad():
            liger_logits = liger_run(lambda: liger_model(ids).logits)
        lcalls = _layer_calls(liger_model, args)
        per_call["liger"] = {k: liger_run(lambda f=f: _per_call_us(f)) for k, f in lcalls.items()}
        result["liger_max_logit_diff"] = float((liger_logits.float() - base_logits.float()).abs().max())
        result["liger_within_tolerance"] = _tolerance_share(liger_logits.float(), base_logits.float())
        result["liger_judged"] = _judged(liger_logits, base_logits, truth_logits)

    runs = {"own": lambda: _timed_generate(model, ids, args.new),
            "pack": lambda: _timed_generate(served_model, ids, args.new)}
    if liger_model is not None:
        runs["liger"] = lambda: liger_run(lambda: _timed_generate(liger_model, ids, args.new))
    names = list(runs)
    times: dict[str, list[float]] = {n: [] for n in names}
    outs: dict = {}
    for r in range(args.repeats + 1):  # the first round warms every path up and is not counted
        for name in names[r % len(names):] + names[:r % len(names)]:
            s, out = runs[name]()
            if r:
                times[name].append(s)
                outs.setdefault(name, out)
    result["stats"] = report.stats()
    if "liger" in outs:
        result["liger_tokens_equal"] = float((outs["liger"][:, args.prompt:] == outs["own"][:, args.prompt:])
                                             .float().mean())

    tokens = args.batch * args.new
    tps = {k: tokens / statistics.median(v) for k, v in times.items()}
    result.update({
        "tokens_per_s": tps, "generate_s": times,
        "pack_first_generate_tokens_per_s": tokens / result["pack_first_generate_s"],
        "pack_vs_own": tps["pack"] / tps["own"],
        "pack_vs_liger": tps["pack"] / tps["liger"] if "liger" in tps else None,
        "liger_vs_own": tps["liger"] / tps["own"] if "liger" in tps else None,
        "max_logit_diff": float((pack_logits.float() - base_logits.float()).abs().max()),
        "within_tolerance": _tolerance_share(pack_logits.float(), base_logits.float()),
        "judged": _judged(pack_logits, base_logits, truth_logits),
        "own_max_diff_from_float64": float((base_logits.double() - truth_logits).abs().max()),
        "pack_max_diff_from_float64": float((pack_logits.double() - truth_logits).abs().max()),
        "logit_scale": float(base_logits.float().abs().max()),
        "tokens_equal": float((outs["pack"][:, args.prompt:] == outs["own"][:, args.prompt:]).float().mean()),
        "per_call_us": per_call,
    })
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
