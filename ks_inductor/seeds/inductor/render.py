"""An :class:`InductorProgram` as a self-contained candidate module.

The kernels are Inductor's, launched with explicit grids and block sizes (the candidate's tunable parameters);
Inductor's runtime helpers are vendored into the module; ``ModelNew.forward`` allocates what the wrapper
allocated and launches what it launched, in its order. On the interpreter (``target == "cpu"``) the libdevice
calls that the interpreter cannot run become small Triton equivalents; on a GPU the code is Inductor's verbatim.
"""

from __future__ import annotations

import re
from typing import Any

from ks_inductor.seeds.inductor.program import (
    HELPER_PREFIX,
    InductorProgram,
    KernelPlan,
    SeedUnavailable,
    grid,
)

# libdevice functions under TRITON_INTERPRET=1 return nothing; these forms in core Triton run there instead.
_INTERPRETER_LIBDEVICE = {
    "rsqrt": "tl.math.rsqrt(x)", "sqrt": "tl.sqrt(x)", "exp": "tl.exp(x)", "exp2": "tl.exp2(x)",
    "log": "tl.log(x)", "log2": "tl.log2(x)", "sin": "tl.sin(x)", "cos": "tl.cos(x)", "erf": "tl.erf(x)",
    "tanh": "2.0 * tl.sigmoid(2.0 * x) - 1.0", "log1p": "tl.log(1.0 + x)", "expm1": "tl.exp(x) - 1.0",
    "isnan": "x != x", "isinf": "tl.abs(x) == float('inf')", "floor": "tl.floor(x)", "ceil": "tl.ceil(x)",
    "trunc": "tl.where(x >= 0, tl.floor(x), tl.ceil(x))", "abs": "tl.abs(x)", "fabs": "tl.abs(x)",
    "sigmoid": "tl.sigmoid(x)", "nearbyint": "_ld_rint(x)", "rint": "_ld_rint(x)",
}
_RINT = '''
@triton.jit
def _ld_rint(x):
    r = tl.floor(x + 0.5)
    # halfway cases round to even, as libdevice's nearbyint does
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - x) == 0.5) & odd, r - 1.0, r)
'''


def param_name(kernel: int, key: str) -> str:
    return f"K{kernel}_{key}"


def kernel_params(params: dict[str, Any], index: int, kernel: KernelPlan) -> tuple[dict[str, int], int, int]:
    """The block sizes, warps and stages of kernel ``index`` in a candidate's ``params`` (Inductor's first
    configuration for what ``params`` does not set)."""
    base = kernel.configs[0]
    blocks = {k: int(params.get(param_name(index, k), base.kwargs[k])) for k in kernel.config_keys}
    warps = int(params.get(param_name(index, "num_warps"), base.num_warps))
    stages = int(params.get(param_name(index, "num_stages"), base.num_stages))
    return blocks, warps, stages


# Inductor's max2/min2 reduce through a Triton combine function, which the interpreter runs element by element
# (33 s for one 720 x 32 max pool). The interpreter's built-in max and min are fast but drop NaN (numpy's fmax), so
# a row holding NaN takes its sum instead, which is NaN, as max2 and min2 propagate it.
_INTERPRETER_REDUCTIONS = {HELPER_PREFIX + "max2(": "_ld_max2(", HELPER_PREFIX + "min2(": "_ld_min2("}
_INTERPRETER_REDUCTION_HELPERS = {
    "_ld_max2": "tl.max", "_ld_min2": "tl.min",
}
_REDUCTION_HELPER = '''
@triton.jit
def {name}(a, dim):
    has_nan = tl.sum((a != a).to(tl.int32), dim) > 0
    return tl.where(has_nan, tl.sum(a, dim), {op}(a, dim))
'''


def _interpreter_libdevice(kernels_src: str) -> tuple[str, str]:
    """``kernels_src`` with libdevice calls replaced by interpreter-safe helpers, and those helpers."""
    for slow, fast in _INTERPRETER_REDUCTIONS.items():
        kernels_src = re.sub(r"(?<!def )" + re.escape(slow), fast, kernels_src)
    helpers = [_REDUCTION_HELPER.format(name=n, op=op).strip() + "\n"
               for n, op in _INTERPRETER_REDUCTION_HELPERS.items() if n + "(" in kernels_src]
    used = sorted(set(re.findall(r"\blibdevice\.(\w+)\(", kernels_src)))
    missing = [u for u in used if u not in _INTERPRETER_LIBDEVICE]
    if missing:
        raise SeedUnavailable(f"libdevice {', '.join(missing)} cannot run under the Triton interpreter")
    for name in used:
        helpers.append(f"@triton.jit\ndef _ld_{name}(x):\n    return {_INTERPRETER_LIBDEVICE[name]}\n")
    if any("_ld_rint" in _INTERPRETER_LIBDEVICE[u] for u in used):
        helpers.insert(0, _RINT.strip() + "\n")
    return re.sub(r"\blibdevice\.(\w+)\(", r"_ld_\1(", kernels_src), "\n\n".join(helpers)


def render_program(prog: InductorProgram, params: dict[str, Any], *, target: str, state: list[str],
                   state_lines: list[str], init_signature: str, tensor_inputs: list[bool], doc: str) -> str:
    """The candidate module for ``prog`` with launch parameters ``params``.

    ``state`` names Model's parameters and buffers in placeholder order (they come first among the wrapper's
    inputs; ``state_lines`` create them in ``__init__``, where the judge loads the reference's values); the rest
    are ``forward``'s inputs, ``tensor_inputs`` telling which are tensors."""
    n_inputs = len(prog.inputs) - len(state)
    if n_inputs < 0:
        raise SeedUnavailable("Inductor's wrapper takes fewer inputs than Model holds parameters")
    kernels_src = "\n\n\n".join(h for h in prog.helpers) + "\n\n\n" + "\n\n\n".join(k.source for k in prog.kernels)
    imports = ["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl",
               "from triton.language import math as tl_math"]
    shims = ""
    if target == "cpu":
        kernels_src, shims = _interpreter_libdevice(kernels_src)
    elif "libdevice." in kernels_src:
        imports.append("from triton.language.extra import libdevice")

    fwd: list[str] = []
    for i, name in enumerate(prog.inputs):
        fwd.append(f"{name} = self.{state[i]}" if i < len(state) else f"{name} = in{i - len(state)}")
    tensors = [name for i, name in enumerate(prog.inputs) if i < len(state) or tensor_inputs[i - len(state)]]
    if not tensors:
        raise SeedUnavailable("the problem has no tensor input to take the device from")
    fwd.append(f"_device = {tensors[-1]}.device")
    for step in prog.steps:
        if "alloc" in step:
            fwd.append(_alloc(step))
        elif "code" in step:
            fwd.append(step["code"])
        else:
            k = prog.kernels[step["launch"]]
            blocks, warps, stages = kernel_params(params, step["launch"], k)
            g = grid(k, blocks, step["numels"], step.get("grid"))
            kw = ", ".join(f"{key}={val}" for key, val in blocks.items())
            fwd.append(f"{k.name}[{g!r}]({', '.join(step['args'])}, {kw + ', ' if kw else ''}"
                       f"num_warps={warps}, num_stages={stages})")
    outs = prog.outputs
    fwd.append(f"return {outs[0]}" if len(outs) == 1 else f"return ({', '.join(outs)},)")

    init = ["super().__init__()"] + state_lines
    args = ", ".join(f"in{i}" for i in range(n_inputs))
    return (
        f'"""{doc}"""\n' + "\n".join(imports) + "\n\n\n"
        + (shims.strip() + "\n\n\n" if shims else "")
        + kernels_src.strip() + "\n\n\n"
        + "class ModelNew(nn.Module):\n"
        + f"    def __init__(self{', ' + init_signature if init_signature else ''}):\n"
        + "\n".join("        " + ln for ln in init) + "\n\n"
        + f"    def forward(self{', ' + args if args else ''}):\n"
        + "\n".join("        " + ln for ln in fwd) + "\n"
    )


def _alloc(step: dict[str, Any]) -> str:
    size, stride, dtype, name = tuple(step["size"]), tuple(step["stride"]), step["dtype"], step["alloc"]
    if not step.get("zero"):
        return f"{name} = torch.empty_strided({size!r}, {stride!r}, dtype={dtype}, device=_device)"
    extent = 1 + sum((s - 1) * t for s, t in zip(size, stride)) if all(size) else 0
    return (f"{name} = torch.zeros(({extent},), dtype={dtype}, device=_device)"
            f".as_strided({size!r}, {stride!r})")
