"""Registers and machine-instruction counts of a template configuration, compiled for an NVIDIA architecture with
no GPU present.

Triton's wheel carries ptxas and cuobjdump, so a rendered kernel can be compiled for sm_90 on a CPU box. The
problem's ``ModelNew`` runs on CPU tensors of the problem's shapes with Triton's launches recorded instead of run, so
the arguments a launch would pass (and the specializations Triton would derive from them: 16-byte alignment,
multiples of 16, integers equal to 1) are the ones the GPU would see. What it does not see: the device's own
triton, whose compiler may decide otherwise. On the H200 (triton 3.6) a 2-row 8-warp LayerNorm took 64 registers
(as here) and an RMSNorm of the same shape 54 (56 here), and the 32-warp softmax winner spilled nothing, where triton 3.9
here stores 14 values to local memory. Run it in a process started without TRITON_INTERPRET.

    python -m benchmarks.sass_counts --op layernorm --variant rowwise/block --params '{"ROWS": 2, "num_warps": 8}'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ks_inductor.catalogue import PROBLEM_DIR

ROOT = Path(__file__).resolve().parents[1]

_PTR_TYPES = {"torch.bfloat16": "*bf16", "torch.float16": "*fp16", "torch.float32": "*fp32", "torch.float64": "*fp64",
              "torch.int64": "*i64", "torch.int32": "*i32", "torch.int16": "*i16", "torch.int8": "*i8",
              "torch.uint8": "*u8", "torch.bool": "*i1"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")


@dataclass
class KernelCounts:
    name: str
    registers: int
    shared_bytes: int
    instructions: int
    opcodes: dict[str, int] = field(default_factory=dict)
    wide_loads: int = 0
    narrow_loads: int = 0
    # Each global load's full opcode (cache hints included: .EF evict_first, .EL evict_last), in program order.
    loads: list[str] = field(default_factory=list)


def launch_signature(fn: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """Triton's signature, constexprs, attributes and launch options for one recorded call (``kwargs`` loses the
    launch options)."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    options = {k: kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in kwargs}
    values: dict[str, Any] = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    sig: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list] = {}
    for i, p in enumerate(fn.params):
        v = values[p.name] if p.name in values else p.default
        if p.is_constexpr:
            sig[p.name], constexprs[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            if str(v.dtype) not in _PTR_TYPES:
                raise TypeError(f"argument {p.name} of {fn.__name__}: no Triton pointer type for {v.dtype}")
            sig[p.name] = _PTR_TYPES[str(v.dtype)]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, TensorDescriptor):
            dt = _PTR_TYPES[str(v.base.dtype)][1:]
            sig[p.name] = f"tensordesc<{dt}[{', '.join(map(str, v.block_shape))}]>"
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1:  # Triton specializes an integer argument equal to 1 into a constant
                sig[p.name], constexprs[p.name] = "constexpr", 1
                continue
            sig[p.name] = "i32" if -(2**31) <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif v is None:
            sig[p.name], constexprs[p.name] = "constexpr", None
        else:
            raise TypeError(f"argument {p.name} of {fn.__name__}: cannot type {type(v).__name__}")
    return sig, constexprs, attrs, options


def _counts(name: str, kernel: Any) -> KernelCounts:
    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        usage = subprocess.run([str(bindir / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    ops: Counter[str] = Counter()
    wide = narrow = 0
    loads = []
    for ln in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", ln)
        if not m:
            continue
        full = m.group(1)
        ops[full.split(".")[0]] += 1
        if full.startswith("LDG"):
            loads.append(full)
            if ".128" in full or ".64" in full:
                wide += 1
            elif ".U16" in full or ".S16" in full or ".U8" in full:
                narrow += 1
    return KernelCounts(name=name, registers=int(re.findall(r"REG:(\d+)", usage)[0]),
                        shared_bytes=int(kernel.metadata.shared), instructions=sum(ops.values()),
                        opcodes=dict(ops.most_common()), wide_loads=wide, narrow_loads=narrow, loads=loads)


def counts_for_source(source: str, pm: Any, inputs: list[Any], arch: int = 90) -> list[KernelCounts]:
    """Compile each Triton kernel that ``source``'s ``ModelNew`` launches on ``inputs`` (CPU tensors) for
    ``sm_{arch}``, and count its registers and instructions."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ks_inductor.source_module import load_source_module

    calls: list[tuple[Any, tuple, dict]] = []
    jit = triton.runtime.jit.JITFunction
    launch = jit.run

    def record(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        calls.append((self, args, kwargs))

    if triton.knobs.runtime.interpret:
        # Under the interpreter, triton.language's own @jit functions were built as interpreted ones at import,
        # and a compile that reaches them fails: the process itself must start without it.
        raise RuntimeError("compiling for a GPU needs a process started without TRITON_INTERPRET=1")
    folder = tempfile.mkdtemp(prefix="ks-sass-")
    try:
        mod = load_source_module(source, "ks_sass_counts", folder)
        # Launches are recorded, not run; the kernels' @triton.jit helpers stay what they are.
        jit.run = record
        try:
            model = mod.ModelNew(*pm.get_init_inputs())
            with torch.no_grad():
                model(*inputs)
        finally:
            jit.run = launch
        if not calls:
            raise ValueError("the module launched no Triton kernel on these inputs")
        out = []
        for fn, args, kwargs in calls:
            sig, constexprs, attrs, options = launch_signature(fn, args, dict(kwargs))
            src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
            kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
            out.append(_counts(fn.__name__, kernel))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def render_config(op_file: str, variant: str, params: dict[str, Any]) -> tuple[str, Any]:
    """The source of ``variant`` (``template/variant``) for the problem in ``op_file``, rendered for the CUDA target
    with the template's defaults overlaid by ``params``, and the problem's module."""
    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.seeds.families import classify, configured

    problem = load_problem(op_file)
    pm = exec_problem_source(problem.source)
    fm = classify(problem)
    fm.target = "cuda"
    t, vname, full = configured(fm, variant, params)
    return t.render(fm, full, vname), pm


def counts_for_config(op_file: str, variant: str, params: dict[str, Any], arch: int = 90) -> list[KernelCounts]:
    """Render ``variant`` of the problem in ``op_file`` (``render_config``) and count what it launches on the
    problem's own input shapes."""
    source, pm = render_config(op_file, variant, params)
    return counts_for_source(source, pm, pm.get_inputs(), arch)


def main() -> int:
    from benchmarks.gpu.evolve_serving_ops import OPS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, help="one of " + ", ".join(OPS) + ", or a problem file")
    ap.add_argument("--variant", required=True, help="template/variant, e.g. rowwise/block")
    ap.add_argument("--params", default="{}", help="JSON object of parameters over the template's defaults")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", action="store_true", help="print the counts as one JSON list")
    args = ap.parse_args()
    op_file = str(PROBLEM_DIR / OPS[args.op]) if args.op in OPS else args.op
    counts = counts_for_config(op_file, args.variant, json.loads(args.params), args.arch)
    if args.json:
        print(json.dumps([asdict(c) for c in counts]))
        return 0
    for c in counts:
        top = ", ".join(f"{k} {v}" for k, v in list(c.opcodes.items())[:12])
        print(f"{c.name}: {c.registers} registers, {c.shared_bytes} B shared, {c.instructions} instructions "
              f"({c.wide_loads} wide and {c.narrow_loads} narrow global loads); {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
