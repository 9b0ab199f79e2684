"""Probe (measurement only): does issuing a norm's weight and bias loads before its row loads matter per call?

Compiled for sm_90, the row-wise block kernel of the LayerNorm winner (2 rows, 8 warps) issues its row loads first
and its weight and bias loads only after the first warp-level reduction, whatever their order in the source: the
compiler sinks them towards their use. A ``tl.debug_barrier()`` right after the vector loads keeps them first
(same 64 registers, one more barrier; checked offline with ``benchmarks/sass_counts.py``), so their L2 latency
hides under the rows' DRAM latency instead of after the row statistics. Each configuration below is rendered by
the template without (``plain``) and with that barrier (``first``: the template's VFIRST=1; runs 1-4 inserted the
same line with an edit of this probe's own, the same kernel), and timed interleaved with torch's copy, per call (L2
flushed) and back to back in a CUDA graph, in one process.

On the H200 (two processes, benchmarks/results/vector-order-probe-*-session17-run{1,2}.json): pinned first, the
RMSNorm's weight took the 1-row 8-warp kernel from 18.3 to 17.7 us back to back (torch's copy 17.6) and the 2-row one
from 19.2 to 18.8, with per-call times level. LayerNorm lost with its two vectors pinned, 0.7 us at 2 rows and 8
warps (18.9 -> 19.7 per call), except at 1 row and 4 warps (-0.15). So the template offers it as a knob (VFIRST).

    python benchmarks/gpu/probes/vector_order.py TAG [base|wide]   # writes $OUT/vector-order-probe-TAG.json
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.ln_vectors import (  # noqa: E402
    configured_model,
    print_ranking,
    probe_data,
    timed_against_floor,
)

OUT = os.environ.get("OUT", "/tmp")
BASE = {"EVICT": 1, "LOWP": 1, "VEVICT": 1, "RND": 1}
# Run 1 and 2: the session-16 winners' neighbourhood. "wide" (session 17's run 3 and 4): around the 2-row 4-warp
# LayerNorm that the search picked with the vectors pinned.
CONFIGS = {
    "base": {
        "layernorm": [{"ROWS": 2, "num_warps": 8}, {"ROWS": 1, "num_warps": 8}, {"ROWS": 2, "num_warps": 16},
                      {"ROWS": 1, "num_warps": 4}, {"ROWS": 4, "num_warps": 16}],
        "rmsnorm": [{"ROWS": 1, "num_warps": 8, "EVICT": 0}, {"ROWS": 2, "num_warps": 8}],
    },
    "wide": {
        "layernorm": [{"ROWS": 2, "num_warps": 4, "EVICT": 0, "LOWP": 0, "VEVICT": 0},
                      {"ROWS": 2, "num_warps": 4}, {"ROWS": 2, "num_warps": 8},
                      {"ROWS": 4, "num_warps": 8, "EVICT": 0, "VEVICT": 0},
                      {"ROWS": 1, "num_warps": 2, "EVICT": 0, "VEVICT": 0},
                      {"ROWS": 2, "num_warps": 2, "EVICT": 0, "VEVICT": 0},
                      {"ROWS": 4, "num_warps": 4, "EVICT": 0, "VEVICT": 0}],
        "rmsnorm": [{"ROWS": 2, "num_warps": 8, "EVICT": 0, "LOWP": 0}],
    },
}


def main() -> None:
    tag = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "base"
    _, xs, ys, _, _ = probe_data()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tag": tag, "errors": {}}
    import triton
    res["triton"] = triton.__version__
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    with torch.no_grad():
        for op, cfgs in CONFIGS[which].items():
            for cfg in cfgs:
                params = {**BASE, **cfg}
                for first, order in ((0, "plain"), (1, "first")):
                    ref, m = configured_model(op, {**params, "VFIRST": first})
                    name = (f"{op}_R{params['ROWS']}w{params['num_warps']}E{params['EVICT']}V{params['VEVICT']}"
                            f"L{params['LOWP']}_{order}")
                    tools[name] = [(lambda a=a, m=m: m(a)) for a in xs]
                    res["errors"][name] = (m(xs[0]).float() - ref(xs[0]).float()).abs().max().item()
        t0 = time.time()
        res.update(timed_against_floor(tools))
        res["wall_s"] = time.time() - t0
    Path(OUT, f"vector-order-probe-{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"floor {res['floor_ms'] * 1e3:.2f} us; max error {max(res['errors'].values()):.4f}")
    print_ranking(res, res["floor_ms"])


if __name__ == "__main__":
    main()
