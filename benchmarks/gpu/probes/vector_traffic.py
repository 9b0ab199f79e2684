"""Probe (measurement only, never cached or served): what LayerNorm's weight and bias cost per call, split into the
vectors being cold after the flush and the vectors' traffic from L2 to the SMs.

Per call, every program of the first wave asks for the same 16 KiB of weight and bias at once while the L2 holds
none of it; back to back (where LayerNorm runs level with a copy) the vectors stay in L2. The session-17 winner (2
rows, 4 warps, vectors pinned first) is timed, interleaved with torch's copy, as rendered and with its vector loads
edited: through L2 only (``.cg``, no L1 sharing between the programs of an SM), weight only, no vectors. Then the
same tools again per call with the flush followed by a read of the weight and bias, so that they start in L2.

On the H200 (benchmarks/results/vector-traffic-probe-*-session18-*.json, ten processes): without its vectors the
winner runs level with the copy per call, with them 0.5-0.6 us behind it; the weight alone costs as much as both;
the vectors put back in L2 after the flush, read through L2 only, or read from 2-128 copies (one per program in
turn) changed nothing or lost; 64-192 extra multiplies per thread cost the vector-less kernel nothing, 320 about
0.1 us; 12 more registers (3 programs per SM instead of 4) cost 1.3 us; an L1 prefetch of the vectors took the
kernel to 26-43 us. The README's session-18 notes give the figures.

    python benchmarks/gpu/probes/vector_traffic.py TAG [prefetch|replicas]   # writes $OUT/vector-traffic-probe-TAG.json
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.evolve_serving_ops import _cycled  # noqa: E402
from benchmarks.gpu.probes.ln_vectors import (  # noqa: E402
    configured_model,
    print_ranking,
    probe_data,
    timed_against_floor,
)
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
WINNER = {"ROWS": 2, "num_warps": 4, "EVICT": 0, "LOWP": 0, "VEVICT": 0, "VFIRST": 1, "RND": 1}
S16 = {"ROWS": 2, "num_warps": 8, "EVICT": 1, "LOWP": 1, "VEVICT": 1, "VFIRST": 0, "RND": 1}
W_LOAD = "v_p0 = tl.load(p0_ptr + cols, mask=cmask, other=0.0)"
B_LOAD = "v_p1 = tl.load(p1_ptr + cols, mask=cmask, other=0.0)"


def _cg(src: str) -> str:
    for line in (W_LOAD, B_LOAD):
        assert line in src, line
        src = src.replace(line, line[:-1] + ', cache_modifier=".cg")')
    return src


def _drop(*uses: str):
    def edit(src: str) -> str:
        for u in uses:
            assert u in src, u
            src = src.replace(u, "")
        return src
    return edit


NO_VECTORS = _drop("    x_n3 = x_n3 * v_p0\n", "    x_n3 = x_n3 + v_p1\n")


def _extra_muls(k: int, no_vectors: bool = False):
    """``k`` more multiplies per element before the rounding, each by a row scalar the compiler cannot fold
    (``r * 0 + 1`` keeps NaN and infinity): instructions without registers or loads."""
    def edit(src: str) -> str:
        if no_vectors:
            src = NO_VECTORS(src)
        at = "    x_n3 = _rnd_bf16(x_n3)\n"
        assert at in src
        muls = "".join(f"    x_n3 = x_n3 * (x_n3_r * 0.0 + {1 + i * 2.0 ** -20!r})\n" for i in range(k))
        return src.replace(at, muls + at)
    return edit


def _loads_only(src: str) -> str:
    """The vectors still loaded by every program, but each folded into one number at once (times zero: the compiler
    keeps it), so that they hold no registers through the reductions: the loads without the registers."""
    for line, use, vec in ((W_LOAD, "    x_n3 = x_n3 * v_p0\n", "v_p0"), (B_LOAD, "    x_n3 = x_n3 + v_p1\n", "v_p1")):
        assert use in src and line + ".to(tl.float32)[None, :]" in src
        src = src.replace(line + ".to(tl.float32)[None, :]", line + ".to(tl.float32)")
        src = src.replace(use, f"    x_n3 = x_n3 + tl.sum({vec}, axis=0) * 0.0\n")
    return src


def _prefetch_l1(src: str) -> str:
    """Each program first asks for the weight's and bias's lines in its SM's L1 (``prefetch.global.L1``: no
    register holds anything), so that loads of them after the reductions (LATEVEC) find them close."""
    anchor = "    cmask = tl.full([BLOCK_N], 1, tl.int1) if EVEN else cols < n_cols\n"
    assert anchor in src
    asm = '"prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l"'
    lines = "".join(f"    tl.inline_asm_elementwise({asm}, [{p}_ptr + tl.arange(0, BLOCK_N // 64) * 64], "
                    "dtype=tl.int32, is_pure=False, pack=1)\n" for p in ("p0", "p1"))
    return src.replace(anchor, anchor + lines)


def _maxnreg(n: int, then=None):
    def edit(src: str) -> str:
        src = then(src) if then else src
        assert "num_stages=1)" in src
        return src.replace("num_stages=1)", f"num_stages=1, maxnreg={n})")
    return edit


def _replicated(k: int):
    """Program i reads copy i % k of the weight and bias (the model's vectors are replaced by k copies end to end
    before timing): whether many programs asking the L2 for the same lines at once is what costs."""
    def edit(src: str) -> str:
        for line, ptr in ((W_LOAD, "p0_ptr"), (B_LOAD, "p1_ptr")):
            assert line in src
            src = src.replace(line, line.replace(f"{ptr} + cols", f"{ptr} + (tl.program_id(0) % {k}) * BLOCK_N + cols"))
        return src
    edit.replicas = k
    return edit


REPLICA_VARIANTS = {
    "ln_R2w4_pin": (WINNER, None),
    "ln_R2w4_pin_no_vectors": (WINNER, NO_VECTORS),
    **{f"ln_R2w4_pin_replicas{k}": (WINNER, _replicated(k)) for k in (2, 8, 32, 128)},
}


LATE = {"EVICT": 1, "LOWP": 0, "VEVICT": 1, "VFIRST": 0, "RND": 1, "LATEVEC": 1}
PREFETCH_VARIANTS = {
    "ln_R2w4_pin": (WINNER, None),
    "ln_R2w4_pin_no_vectors": (WINNER, NO_VECTORS),
    "ln_R2w4_late": ({**LATE, "ROWS": 2, "num_warps": 4}, None),
    "ln_R2w4_late_prefetch": ({**LATE, "ROWS": 2, "num_warps": 4}, _prefetch_l1),
    "ln_R2w4_late_prefetch_maxnreg96": ({**LATE, "ROWS": 2, "num_warps": 4}, _maxnreg(96, _prefetch_l1)),
    "ln_R2w4_late_maxnreg96": ({**LATE, "ROWS": 2, "num_warps": 4}, _maxnreg(96)),
    "ln_R1w4_late": ({**LATE, "ROWS": 1, "num_warps": 4}, None),
    "ln_R1w4_late_prefetch": ({**LATE, "ROWS": 1, "num_warps": 4}, _prefetch_l1),
    "ln_R2w8_late_prefetch": ({**LATE, "ROWS": 2, "num_warps": 8}, _prefetch_l1),
    "ln_R1w2_late_prefetch": ({**LATE, "ROWS": 1, "num_warps": 2}, _prefetch_l1),
}

VARIANTS = {
    "ln_R2w4_pin": (WINNER, None),
    "ln_R2w4_pin_cg": (WINNER, _cg),
    "ln_R2w4_pin_weight_only": (WINNER, _drop("    x_n3 = x_n3 + v_p1\n")),
    "ln_R2w4_pin_no_vectors": (WINNER, NO_VECTORS),
    "ln_R2w4_pin_loads_only": (WINNER, _loads_only),
    "ln_R2w4_pin_plus64": (WINNER, _extra_muls(1)),
    "ln_R2w4_pin_plus128": (WINNER, _extra_muls(2)),
    "ln_R2w4_pin_no_vectors_plus64": (WINNER, _extra_muls(1, True)),
    "ln_R2w4_pin_no_vectors_plus128": (WINNER, _extra_muls(2, True)),
    "ln_R2w4_pin_no_vectors_plus192": (WINNER, _extra_muls(3, True)),
    "ln_R2w4_pin_no_vectors_plus320": (WINNER, _extra_muls(5, True)),
    "ln_R2w8_s16": (S16, None),
    "ln_R2w8_s16_no_vectors": (S16, NO_VECTORS),
}


def main() -> None:
    tag = sys.argv[1]
    variants = {"prefetch": PREFETCH_VARIANTS, "replicas": REPLICA_VARIANTS}.get(sys.argv[2], VARIANTS) \
        if len(sys.argv) > 2 else VARIANTS
    _, xs, ys, _, _ = probe_data()
    import triton
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "tag": tag, "errors": {}}
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    weights = []
    with torch.no_grad():
        for name, (params, edit) in variants.items():
            ref, m = configured_model("layernorm", params, edit)
            k = getattr(edit, "replicas", 1)
            if k > 1:
                m.weight = torch.nn.Parameter(m.weight.detach().repeat(k))
                m.bias = torch.nn.Parameter(m.bias.detach().repeat(k))
            tools[name] = [(lambda a=a, m=m: m(a)) for a in xs]
            res["errors"][name] = (m(xs[0]).float() - ref(xs[0]).float()).abs().max().item()
            weights.append((m.weight, m.bias))
        t0 = time.time()
        res.update(timed_against_floor(tools))
        # Again per call, with the vectors put back in L2 after the flush (a read of each, 16 KiB in all).
        flush = T.make_l2_flush("cuda")
        sink = torch.empty(len(weights), 2, dtype=torch.bfloat16, device="cuda")

        def flush_then_touch() -> None:
            flush()
            for i, (w, b) in enumerate(weights):
                torch.amax(w, 0, out=sink[i, 0])
                torch.amax(b, 0, out=sink[i, 1])

        warm = T.benchmark_interleaved({k: _cycled(v) for k, v in tools.items()}, rounds=7, rep_ms=60,
                                       flush=flush_then_touch)
        res["per_call_vectors_in_l2"] = {k: T.summarize(v).median_ms for k, v in warm.items()}
        res["wall_s"] = time.time() - t0
    Path(OUT, f"vector-traffic-probe-{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"[{tag}] floor {res['floor_ms'] * 1e3:.2f} us; errors {res['errors']}")
    print_ranking(res, res["floor_ms"])
    print(f"[{tag}] per call, vectors in L2 after the flush:")
    for k, v in sorted(res["per_call_vectors_in_l2"].items(), key=lambda kv: kv[1]):
        print(f"[{tag}] {k:28s} {v * 1e3:6.2f} us {res['floor_ms'] / v:5.1%}   cold {res['per_call'][k] * 1e3:6.2f}")


if __name__ == "__main__":
    main()
