# A candidate's process that lies in every message it sends: at import it takes over its worker's protocol channel,
# writes a launch plan of its own making, reports stages that never ran and a finished job with no findings, made-up
# launch counts, timing samples and checks, and exits before the judge's recording runs. All the judge can take from
# it is the plan, which names this module's kernel.
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

_imp = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__dict__["__import__"]
_sys, _os = _imp("sys"), _imp("os")
_worker = next((m for m in (_sys.modules.get("__main__"), _sys.modules.get("ks_inductor.judge.protocol"))
                if getattr(m, "_events", None) is not None), None)
if _worker is not None:
    rows, cols = 64, 256
    view = lambda sid, shape, stride: {"storage": sid, "offset": 0, "shape": shape, "stride": stride,  # noqa: E731
                                       "dtype": "float32"}
    plan = {"version": 1, "notes": ["recorded on every trial's inputs"],
            "storages": [{"kind": "input", "index": 0, "nbytes": rows * cols * 4},
                         {"kind": "state", "nbytes": cols * 4}, {"kind": "alloc", "nbytes": rows * cols * 4}],
            "steps": [{"op": "launch", "kernel": "_rmsnorm_kernel", "grid": [rows, 1, 1],
                       "args": {"x_ptr": {"t": view(0, [rows, cols], [cols, 1])}, "w_ptr": {"t": view(1, [cols], [1])},
                                "out_ptr": {"t": view(2, [rows, cols], [cols, 1])}, "n_cols": {"v": cols},
                                "eps": {"v": 1e-6}, "BLOCK": {"v": cols}}}],
            "outputs": [view(2, [rows, cols], [cols, 1])]}
    with open("plan.json", "w") as f:
        f.write(json.dumps(plan))
    _st = _imp("safetensors.torch", fromlist=["save_file", "load_file"])
    _weight = _st.load_file("state.safetensors")["weight"] if _os.path.exists("state.safetensors") else torch.ones(cols)
    _st.save_file({"s1": _weight.float().contiguous().view(torch.uint8).clone()}, "plan_state.safetensors")
    for stage in ("compile", "correctness", "timing"):
        _worker.send({"event": "stage", "stage": stage})
    _worker.send({"event": "result", "ok": True, "flags": [], "ops_seen": [], "launches": {"_rmsnorm_kernel": 99},
                  "launches_per_call": [1] * 5, "samples": {"candidate": [[1e-6] * 5] * 5}, "timed_checks": 0,
                  "graphs": 0, "wall": {"hidden_ms": 0.0, "overhead_ms": 0.0}, "notes": ["every trial passed"]})
    _os._exit(0)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.shape[-1]
        _rmsnorm_kernel[(x.numel() // n,)](x, self.weight, out, n, self.eps, BLOCK=triton.next_power_of_2(n))
        return out
