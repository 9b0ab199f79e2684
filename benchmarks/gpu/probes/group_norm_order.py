"""Probe (never cached or served): does the group-norm template's apply kernel gain from taking its chunks in
reverse (``REV=1``), so that its first reads hit what the statistics kernel left in the L2? And from a finalize
kernel that merges each group's chunk statistics once?

For each KernelBench problem given, the template's cuda default is rendered in both variants with REV 0 and 1,
ITERS as is and doubled, one or two stages, checked against the problem's Model, and timed per call (L2 flushed, interleaved rounds) next to the
Model itself and a torch copy of the input; the floor is the problem's bytes at the copy rate of the anchors
(the two-kernel form moves 1.5 times those bytes: the input is read twice).

    python benchmarks/gpu/probes/group_norm_order.py third_party/KernelBench/KernelBench/level1/40_LayerNorm.py ...
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from ks_inductor.evolve.families import classify  # noqa: E402
from ks_inductor.evolve.templates import template_named  # noqa: E402
from ks_inductor.judge import timing as T  # noqa: E402
from ks_inductor.problem import exec_problem_source, problem_from_source  # noqa: E402
from ks_inductor.source_module import load_source_module  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
COPY_GBPS = 4227.0  # shared/anchors: device-to-device copy on this H200


def load(path: str) -> tuple:
    """A KernelBench problem on the GPU: the problem, its family match, the group-norm template and its cuda default,
    the problem's module, its Model (seed 0) and one input."""
    src = Path(path).read_text()
    problem = problem_from_source(src, name=Path(path).stem)
    fm = classify(problem)
    fm.target = "cuda"
    t = template_named("group_norm")
    mod = exec_problem_source(src, problem.name)
    torch.manual_seed(0)
    ref = mod.Model(*mod.get_init_inputs()).cuda()
    with torch.device("cuda"):
        x = mod.get_inputs()[0]
    return problem, fm, t, t.default(fm, "split", "cuda"), mod, ref, x


def probe(path: str) -> dict:
    problem, fm, t, base, mod, ref, x = load(path)
    with torch.no_grad():
        want = ref(x)
    tools = {"model": lambda: ref(x), "torch_copy": lambda o=torch.empty_like(x): o.copy_(x)}
    res: dict = {"problem": problem.name, "shape": list(x.shape), "default": base, "variants": {}}
    for variant, iters, rev, stages in [(v, i, r, st) for v in ("split", "finalize")
                                        for i in sorted({base["ITERS"], min(32, base["ITERS"] * 2)})
                                        for r in (0, 1) for st in (1, 2)]:
        p = {**base, "ITERS": iters, "REV": rev, "num_stages": stages}
        if not t.feasible(fm, p, variant):
            continue
        new = load_source_module(t.render(fm, p, variant), "ks_gn_probe", "/tmp/ks_probe").ModelNew(
            *mod.get_init_inputs()).cuda()
        new.load_state_dict(ref.state_dict())
        with torch.no_grad():
            got = new(x)
        err = float((got.float() - want.float()).abs().max())
        name = f"{variant[0]}I{iters}R{rev}S{stages}"
        res["variants"][name] = {"params": p, "max_abs_err": err}
        tools[name] = lambda m=new: m(x)
    samples = T.benchmark_interleaved(tools, rounds=5, rep_ms=100, flush=T.make_l2_flush("cuda"))
    floor_ms = 2 * x.numel() * x.element_size() / (COPY_GBPS * 1e9) * 1e3
    res["floor_ms"] = floor_ms
    res["per_call_ms"] = {k: T.summarize(v).median_ms for k, v in samples.items()}
    for k in sorted(res["per_call_ms"], key=res["per_call_ms"].get):
        ms = res["per_call_ms"][k]
        print(f"{problem.name:24s} {k:12s} {ms * 1e3:9.1f} us  {floor_ms / ms:6.1%} of floor  "
              f"{res['variants'].get(k, {}).get('max_abs_err', '')}", flush=True)
    return res


def main() -> None:
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for path in sys.argv[1:]:
        with torch.no_grad():
            out["rows"].append(probe(path))
        torch.cuda.empty_cache()
    Path(OUT, "group-norm-order-probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
