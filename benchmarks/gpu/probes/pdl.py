"""Probe (measurement only): what programmatic dependent launch (PDL) gives the row-wise template's norms.

For LayerNorm and RMSNorm at the anchors' shape, the row-wise block variant with a results file's winning params is
rendered, then timed as rendered and with PDL added to its source (``gdc_wait`` before any memory access,
dependents let launch at once, ``launch_pdl`` on the launch), interleaved with torch's copy: per call (L2 flushed)
and in the steady state (back to back in one CUDA graph). A third steady state puts each call after torch's add of
a residual, the way a norm follows another kernel in a model: there the previous kernel does not signal, so PDL can
only hide the launch. Every PDL output is checked after a graph replay, where a missing wait would show.

On the H200 (torch 2.11, triton 3.6; three processes, benchmarks/results/pdl-probe-*-session17-run{1,2,3}.json) PDL
was not kept. Back to back with itself it took LayerNorm from 19.4 to 18.8 us and RMSNorm from 18.3 to 17.7, but
that is each call letting the next one in early, which no other kernel does. After torch's add, a norm's share of
the graph rose by 0.2-0.3 us (LayerNorm) and 0.4 us (RMSNorm) with PDL; per call nothing moved.

    python benchmarks/gpu/probes/pdl.py RESULTS.json TAG   # writes $OUT/pdl-probe-TAG.json
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
from ks_inductor.judge import timing as T  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")


def with_pdl(source: str) -> str:
    """``source`` launched with PDL: the kernel waits for the previous grid before anything else and lets the next
    one launch at once; the launch asks for programmatic stream serialization."""
    head = "def _row_kernel("
    i = source.index(":\n", source.index(head)) + 2
    source = (source[:i] + "    tl.extra.cuda.gdc_wait()\n    tl.extra.cuda.gdc_launch_dependents()\n" + source[i:])
    return source.replace("num_stages=1)", "num_stages=1, launch_pdl=True)")


def _graph_check(model, ref, xs) -> float:
    """Largest error over every set's output after one replay of a graph of all sets back to back, twice over."""
    outs = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in xs:
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(2):
            for x in xs:
                outs.append(model(x))
    for y in outs:
        y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return max((y.float() - ref(x).float()).abs().max().item() for y, x in zip(outs, xs + xs))


def main() -> None:
    results = json.loads(Path(sys.argv[1]).read_text())
    tag = sys.argv[2]
    _, xs, ys, _, _ = probe_data()
    rs = [torch.randn_like(x) for x in xs]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tag": tag, "errors": {},
           "graph_errors": {}}
    import triton
    res["triton"] = triton.__version__
    tools = {"torch_copy": [(lambda a=a, o=o: o.copy_(a)) for a, o in zip(xs, ys)]}
    after_add = {"add_only": [(lambda a=a, r=r: torch.add(a, r)) for a, r in zip(xs, rs)]}
    with torch.no_grad():
        for op in ("layernorm", "rmsnorm"):
            for pdl in (0, 1):
                ref, m = configured_model(op, results["ops"][op]["best_params"], with_pdl if pdl else None)
                name = f"{op}_pdl{pdl}"
                tools[name] = [(lambda a=a, m=m: m(a)) for a in xs]
                after_add[f"add_{name}"] = [(lambda a=a, r=r, m=m: m(torch.add(a, r))) for a, r in zip(xs, rs)]
                res["errors"][name] = (m(xs[0]).float() - ref(xs[0]).float()).abs().max().item()
                res["graph_errors"][name] = _graph_check(m, ref, xs)
        t0 = time.time()
        res.update(timed_against_floor(tools))
        st, err = T.benchmark_graphed(after_add, rounds=5)
        res["after_add_stream"] = {k: T.summarize(v).median_ms for k, v in st.items()}
        res["after_add_errors"] = err
        res["wall_s"] = time.time() - t0
    Path(OUT, f"pdl-probe-{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"floor {res['floor_ms'] * 1e3:.2f} us; errors {res['errors']}; graph {res['graph_errors']}")
    print_ranking(res, res["floor_ms"])
    base = res["after_add_stream"].get("add_only", float("nan"))
    for k, v in res["after_add_stream"].items():
        print(f"{k:24s} {v * 1e3:6.2f} us (norm's share {(v - base) * 1e3:6.2f})")


if __name__ == "__main__":
    main()
