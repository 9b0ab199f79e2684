"""LMDeploy's own kernels as a search's peer: the rooms of its layer problems with its kernels timed beside eager
and Inductor, and a short search of one of them judged against all three.

The problems are what ``pack export --stack lmdeploy`` searches for a Llama-7B-sized deployment (hidden 4096,
intermediate 11008, bf16, LMDeploy's packed tokens ``(1, tokens, hidden)``): the RMSNorm at 2,048 and 16 tokens, the
fused residual RMSNorm at 16, SiLU·mul at 2,048. The peer is ``ops.STACK_PEERS["lmdeploy"]``'s factory, the
implementation LMDeploy's CUDA backend builds (its Triton kernels), found by computing
(``integrations.lmdeploy.own_kernel``).

    python -m benchmarks.gpu.stack_peer --out $OUT/stack-peer.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=6, help="judgments of the search (0: rooms only)")
    ap.add_argument("--time-limit", type=float, default=40.0)
    ap.add_argument("--peer", default=None, help="the factory, module:function (default: the stack's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import triton

    try:
        from kernelsmith_integrations import lmdeploy as L
        from kernelsmith_integrations.ops import stack_baselines, stack_peers
    except ImportError:  # run from a checkout that is not installed
        from integrations import lmdeploy as L
        from integrations.ops import stack_baselines, stack_peers
    import lmdeploy

    from kernel_cache.store import KernelStore
    from ks_inductor.evolve import EvolveConfig, evolve_problem
    from ks_inductor.judge import Judge, JudgeConfig

    peers = stack_peers("lmdeploy")
    if args.peer:
        peers = {"lmdeploy": args.peer}
    baselines = stack_baselines("lmdeploy")
    bf = torch.bfloat16
    problems = L.layer_problems(norms=[((1, 2048, 4096), bf, 1e-6), ((1, 16, 4096), bf, 1e-6)],
                                silu_and_mul=[((1, 2048, 22016), bf)],
                                residual_norms=[((1, 16, 4096), bf, 1e-6)])
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "lmdeploy": lmdeploy.__version__, "peers": peers,
                           "baselines": list(baselines), "rooms": [],
                           "command": "python -m benchmarks.gpu.stack_peer " + " ".join(sys.argv[1:])}
    cfg = JudgeConfig.for_search(backend="triton-cuda", baselines=baselines, final_baselines=baselines, peers=peers)
    with Judge(cfg) as judge:
        for p in problems:
            room = judge.room(p)
            res["rooms"].append({"name": p.name, "inputs": p.signature(), **room.to_json()})
            print(f"{p.name} {p.signature()}: {room.summary()} {room.note}", flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1, default=str))
        if args.budget:
            store = KernelStore(f"sqlite:///{tempfile.mkdtemp(prefix='ks-peer-')}/k.db")
            t0 = time.monotonic()
            summary = evolve_problem(problems[1], EvolveConfig(budget=args.budget, time_limit_s=args.time_limit,
                                                               backend="triton-cuda", baselines=baselines,
                                                               peers=peers),
                                     store, judge=judge, progress=False)
            r = summary.best_result
            res["search"] = {"problem": problems[1].name, "inputs": problems[1].signature(),
                             "wall_s": time.monotonic() - t0, "judged": summary.judged,
                             "status": summary.best.status if summary.best else None, "note": summary.note,
                             "speedup_eager": r.speedup_eager if r else None,
                             "speedup_inductor": r.speedup_inductor if r else None,
                             "speedup_peers": r.speedup_peers if r else None,
                             "timings_ms": {k: v.median_ms for k, v in r.timings.items()} if r else None}
            print(f"search: {res['search']}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
