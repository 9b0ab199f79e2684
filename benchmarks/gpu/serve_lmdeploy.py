"""LMDeploy's own layers (``RMSNorm`` with and without the residual add, ``SiluAndMul``) with their Triton kernels,
against the same layer classes serving a pack through ``integrations.lmdeploy``, op by op, in one process.

The pack is built on the spot for the token counts given, as ``kernelsmith pack export --stack lmdeploy`` builds
it (``layer_problems`` -> ``pack_for_problems``: warm, export); an op with no kernel in the pack, or whose kernel
loses its race to LMDeploy's own, runs LMDeploy's kernel through the guard's fallback, so its timing shows the
guard's cost alone.

    python benchmarks/gpu/serve_lmdeploy.py --budget 12 --out $OUT/serve_lmdeploy.json
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


def _us(fn, args, n: int = 200) -> float:
    import torch

    with torch.no_grad():
        for _ in range(10):
            fn(*args)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--tokens", type=int, action="append", default=None, help="packed tokens per forward")
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--time-per-op", type=float, default=45.0)
    p.add_argument("--out", default="serve_lmdeploy.json")
    args = p.parse_args()
    tokens = args.tokens or [2048, 16]

    import torch
    from lmdeploy.pytorch.nn.activation import SiluAndMul
    from lmdeploy.pytorch.nn.norm import RMSNorm
    from lmdeploy.version import __version__ as lmdeploy_version
    from rich.console import Console

    from integrations import lmdeploy as L
    from integrations.ops import pack_for_problems
    from kernel_cache.access import open_store
    from ks_inductor.evolve import EvolveConfig

    dt, eps, h, inter = torch.bfloat16, 1e-6, args.hidden, args.intermediate
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "lmdeploy": lmdeploy_version,
                    "args": vars(args) | {"tokens": tokens}}
    norms = [((1, t, h), dt, eps) for t in tokens]
    problems = L.layer_problems(norms, [((1, t, 2 * inter), dt) for t in tokens], norms)
    work = Path(tempfile.mkdtemp(prefix="ks-lmdeploy-bench-"))
    t0 = time.perf_counter()
    # The path ``kernelsmith pack export --stack lmdeploy`` takes: warm, then export what has a kernel.
    pack_build = pack_for_problems(problems, work / "lmdeploy.kspack", db=str(work / "k.db"),
                              config=EvolveConfig(budget=args.budget, time_limit_s=args.time_per_op,
                                                  backend="triton-cuda"),
                              console=Console(stderr=True), stack="lmdeploy")
    with open_store(str(work / "k.db")) as store:
        result["problems"] = [{"name": pr.name, "inputs": pr.signature(), "status": i.status,
                               "speedup_inductor": i.best_speedup,
                               "kernels": [{"status": k.status, "speedup_inductor": k.speedup_inductor,
                                            "speedup_eager": k.speedup_eager}
                                           for k in store.kernels(problem_key=pr.key)]}
                              for pr, i in zip(problems, pack_build.warm.items)]
    result["pack_build_s"] = time.perf_counter() - t0

    def build():
        torch.manual_seed(0)
        norm = RMSNorm(h, eps, dtype=dt, device="cuda")
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(h, device="cuda"))
        return norm, SiluAndMul(inplace=False)

    own_norm, own_act = build()
    st = L.install(work / "lmdeploy.kspack" if pack_build.export is not None else work / "none")
    result["refused"] = st.refused
    ks_norm, ks_act = build()
    ops = []
    for t in tokens:
        g = torch.Generator(device="cuda").manual_seed(t)
        x = torch.randn(1, t, h, device="cuda", dtype=dt, generator=g)
        r = torch.randn(1, t, h, device="cuda", dtype=dt, generator=g)
        a = torch.randn(1, t, 2 * inter, device="cuda", dtype=dt, generator=g)
        cases = {"rmsnorm": (own_norm, ks_norm, (x,)),
                 "add_rmsnorm": (own_norm, ks_norm, (x, r)),
                 "silu_and_mul": (own_act, ks_act, (a,))}
        for name, (own, ks, inp) in cases.items():
            before = dict(st.stats()["hits"])
            with torch.no_grad():
                want, got = own(*[i.clone() for i in inp]), ks(*[i.clone() for i in inp])
            served = st.stats()["hits"].get(name, 0) > before.get(name, 0)
            want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
            diff = max(float((w.float() - o.float()).abs().max()) for w, o in zip(want, got))
            own_us = _us(own, [i.clone() for i in inp])
            ks_us = _us(ks, [i.clone() for i in inp])
            ops.append({"op": name, "tokens": t, "served": served, "lmdeploy_us": own_us, "kernelsmith_us": ks_us,
                        "speedup": own_us / ks_us, "max_abs_diff": diff})
            print(json.dumps(ops[-1]), flush=True)
    result["ops"] = ops
    result["stats"] = st.stats()
    L.uninstall()
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
