"""A transformers Llama-style model (random weights) with and without a pack, on one GPU.

The pack is built by ``integrations.transformers.pack_for_model`` for the deployment's shapes (the prefill of
``--prompt`` tokens and the decode step, at ``--batch``), then served by ``apply_kernelsmith``. Reported: greedy
``generate()`` tokens per second both ways, the largest prefill logit difference, how many generated tokens agree,
the guard's hit and fallback counters, and one swapped layer timed per call against its own forward.

    python benchmarks/gpu/serve_transformers.py --budget 12 --out $OUT/serve_transformers.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timed_generate(model, ids, new: int, pad: int) -> tuple[float, object]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=pad)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _per_call_us(fn, x, n: int = 200) -> float:
    import torch

    with torch.no_grad():
        for _ in range(10):
            fn(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn(x)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--time-per-op", type=float, default=60.0)
    p.add_argument("--out", default="serve_transformers.json")
    args = p.parse_args()

    import torch
    import transformers
    from rich.console import Console
    from transformers import LlamaConfig, LlamaForCausalLM

    from integrations.transformers import apply_kernelsmith, pack_for_model, remove_kernelsmith
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
                    "transformers": transformers.__version__, "args": vars(args)}

    work = Path(tempfile.mkdtemp(prefix="ks-serve-bench-"))
    t0 = time.perf_counter()
    build = pack_for_model(model, [(ids,), (ids[:, :1],)], work / "llama.kspack", db=str(work / "k.db"),
                           config=EvolveConfig(budget=args.budget, time_limit_s=args.time_per_op,
                                               backend="triton-cuda"),
                           console=Console(stderr=True))
    result["pack_build_s"] = time.perf_counter() - t0
    result["problems"] = [{"name": p.name, "inputs": p.signature(), "packed": p.key not in build.missing,
                           "speedup": next((i.best_speedup for i in build.warm.items if i.key == p.key), None)}
                          for p in build.problems]
    from kernel_cache.store import KernelStore

    with KernelStore(str(work / "k.db")) as store:
        for entry, prob in zip(result["problems"], build.problems):
            steps = store.steps(problem_key=prob.key)
            entry["steps"] = [{"verdict": s.verdict, "correct": s.correct, "speedup": s.child_speedup,
                               "feedback": s.feedback[:200]} for s in steps[:4]]
            entry["kernels"] = [{"status": k.status, "speedup_inductor": k.speedup_inductor,
                                 "speedup_eager": k.speedup_eager} for k in store.kernels(problem_key=prob.key)]

    pad = 0
    _, base_out0 = _timed_generate(model, ids, args.new, pad)
    base_s, base_out = _timed_generate(model, ids, args.new, pad)
    with torch.no_grad():
        base_logits = model(ids).logits.float()
    norm = model.model.layers[0].post_attention_layernorm
    x1 = torch.randn(args.batch, 1, args.hidden, device="cuda", dtype=torch.bfloat16)
    norm_own_us = _per_call_us(norm, x1)

    report = apply_kernelsmith(model, work / "llama.kspack" if build.export is not None else work / "none")
    result["swapped"] = len(report.swapped)
    result["refused"] = report.refused
    with torch.no_grad():
        pack_logits = model(ids).logits.float()
    _timed_generate(model, ids, args.new, pad)
    pack_s, pack_out = _timed_generate(model, ids, args.new, pad)
    norm_pack_us = _per_call_us(norm, x1)
    tokens = args.batch * args.new
    gen_base, gen_pack = base_out[:, args.prompt:], pack_out[:, args.prompt:]
    result.update({
        "tokens_per_s_without": tokens / base_s, "tokens_per_s_with": tokens / pack_s,
        "max_logit_diff": float((pack_logits - base_logits).abs().max()),
        "logit_scale": float(base_logits.abs().max()),
        "generated_tokens_equal": float((gen_base == gen_pack).float().mean()),
        # two runs without the pack: how far greedy generation agrees with itself on this GPU
        "generated_tokens_equal_baseline_rerun": float((gen_base == base_out0[:, args.prompt:]).float().mean()),
        "norm_decode_call_us_own": norm_own_us, "norm_decode_call_us_pack": norm_pack_us,
        "stats": report.stats(),
    })
    remove_kernelsmith(model)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
