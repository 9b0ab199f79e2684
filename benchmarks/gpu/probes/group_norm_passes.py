"""Probe (never cached or served): how fast does each of the group-norm template's two passes run on its own, and
do they want the same launch shape?

The template's statistics kernel only reads; its apply kernel reads and writes. They share BLOCK, ITERS, warps and
stages. For a KernelBench problem, this renders the template over a grid of those, checks each rendering against
the problem's Model, and times per call (L2 flushed, interleaved rounds): the statistics kernel alone, the whole
forward, torch's sum of the input (a read of the same bytes), torch's copy, the eager Model and Inductor's.

    python benchmarks/gpu/probes/group_norm_passes.py third_party/KernelBench/KernelBench/level1/33_BatchNorm.py TAG
"""

import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.gpu.probes.group_norm_order import load  # noqa: E402
from ks_inductor.evolve.templates.group_norm import _chunks  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402
from ks_inductor.source_module import load_source_module  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")


def main() -> None:
    path, tag = sys.argv[1], sys.argv[2]
    problem, fm, t, base, mod, ref, x = load(path)
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    with torch.no_grad():
        want = ref(x)
    compiled = torch.compile(mod.Model(*mod.get_init_inputs()).cuda())
    with torch.no_grad():
        compiled(x)
    nbytes = x.numel() * x.element_size()
    tools = {"model": lambda: ref(x), "inductor": lambda: compiled(x), "torch_sum": lambda: x.sum(),
             "torch_copy": lambda o=torch.empty_like(x): o.copy_(x)}
    rows: dict = {}
    grid_space = itertools.product([1024, 2048, 4096], [4, 8, 16], [8, 16, 32], [1, 3])
    for block, warps, iters, stages in grid_space:
        p = {**base, "BLOCK": block, "num_warps": warps, "ITERS": iters, "num_stages": stages, "REV": 0}
        if not t.feasible(fm, p, "split"):
            continue
        name = f"B{block}w{warps}I{iters}S{stages}"
        try:
            m = load_source_module(t.render(fm, p, "split"), "ks_gn_passes", "/tmp/ks_probe")
            new = m.ModelNew(*mod.get_init_inputs()).cuda()
            new.load_state_dict(state)
            with torch.no_grad():
                got = new(x)
        except Exception as e:  # a shape the compiler refuses is a finding, not a crash
            rows[name] = {"params": p, "error": repr(e)[:300]}
            continue
        grid = fm.attrs["rows"] * _chunks(fm.attrs, p)
        part = torch.empty(2 * grid, dtype=torch.float32, device="cuda")
        rows[name] = {"params": p, "max_abs_err": float((got.float() - want.float()).abs().max())}
        tools["stats_" + name] = (lambda k=m._group_stats, g=grid, pp=part, b=block, i=iters, w=warps, s=stages:
                                  k[(g,)](x, pp, BLOCK=b, ITERS=i, num_warps=w, num_stages=s))
        tools["full_" + name] = lambda mm=new: mm(x)
    with torch.no_grad():
        samples = T.benchmark_interleaved(tools, rounds=5, rep_ms=40, flush=T.make_l2_flush("cuda"))
    ms = {k: T.summarize(v).median_ms for k, v in samples.items()}
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "problem": problem.name,
           "shape": list(x.shape), "bytes": nbytes, "default": base, "rows": rows, "per_call_ms": ms}
    for k in sorted(ms, key=ms.get):
        # Bytes a pass cannot avoid: one read for the statistics and the sum, a read and a write for the rest.
        moved = nbytes if k.startswith(("stats_", "torch_sum")) else 2 * nbytes
        err = rows.get(k.split("_", 1)[-1], {}).get("max_abs_err", "")
        print(f"{k:26s} {ms[k] * 1e3:9.1f} us  {moved / (ms[k] * 1e-3) / 1e9:7.0f} GB/s  {err}", flush=True)
    Path(OUT, f"group-norm-passes-{tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
