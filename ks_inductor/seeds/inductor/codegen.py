"""Inductor's own Triton for a problem, as a plan a seed can be rendered from.

Runs in a throwaway process (``python -m ks_inductor.seeds.inductor.codegen``, a problem as JSON on stdin, the
plan as JSON on stdout): code generation changes process-wide state (Inductor's caches, and on a CPU host the
stand-in CUDA device of :mod:`fake_device`), and the process that holds the search must not inherit it.

The problem's aten graph (the one its canonical key is computed from, placeholders in ``Model``'s parameter,
buffer, input order) is compiled by Inductor for a CUDA device with code generation only: nothing is compiled to
a binary or launched. The wrapper Inductor writes is then read statement by statement (an AST walk, never text
matching) into a :class:`~ks_inductor.seeds.inductor.program.InductorProgram`: allocations, views and kernel
launches in order. Each kernel keeps Inductor's source, the launch configurations Inductor's heuristics would
autotune over, and its grid rule. Whatever is not a Triton kernel (a cuBLAS or cuDNN call, an aten fallback, a
random seed) makes the plan unavailable, with the statement that did it as the reason.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import math
import os
import re
import sys
from typing import Any

from ks_inductor.judge.static_checks import dotted_name
from ks_inductor.seeds.inductor.program import (
    GRID_TYPES,
    HELPER_PREFIX,
    InductorProgram,
    KernelPlan,
    LaunchConfig,
    SeedUnavailable,
)

# Statements of Inductor's wrapper that only check or set up what the seed's forward does not need.
_SKIPPED_CALLS = {"assert_size_stride", "assert_alignment", "torch.cuda.set_device", "args.clear",
                  "torch.cuda.synchronize", "check_memory_overlap"}
_SKIPPED_ASSIGNS = {"get_raw_stream", "copy_if_misaligned"}
_ALLOC_CALLS = {"empty_strided_cuda", "empty_strided"}
_HEURISTICS = {"pointwise", "reduction", "persistent_reduction"}


def _dotted(node: ast.AST) -> str:
    return dotted_name(node) or ""


# --------------------------------------------------------------------------------------------- code generation


def wrapper_source(problem_source: str, name: str, options: dict[str, Any]) -> str:
    """The Python wrapper Inductor generates for ``problem_source``'s aten graph on a CUDA device."""
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.problem_tracing import trace_problem_module

    mod = exec_problem_source(problem_source, f"<{name}>")
    gm = trace_problem_module(mod, f"<{name}>").graph_module
    gm.graph._codegen = torch.fx.graph.CodeGen()  # flat placeholders in, not make_fx's (params, buffers, *args)
    cuda = torch.device("cuda", 0)
    for node in gm.graph.nodes:  # factory calls in the graph (a zeros accumulator, an arange) follow the inputs
        dev = node.kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cpu":
            node.kwargs = {**node.kwargs, "device": cuda}
    gm.recompile()

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs: list[Any] = []
    with mode:
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                inputs.append(torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=cuda))
            else:
                inputs.append(val)

    codes: list[str] = []

    def capture(self: Any) -> Any:
        wrapper, _ = self.codegen()
        codes.append(wrapper.value)

        class _NotRun:
            def call(self, *args: Any) -> None:
                return None

        return _NotRun()

    template = bool(options.get("template"))
    patches = {
        "max_autotune": False, "max_autotune_gemm": template, "graph_partition": False, "cpp_wrapper": False,
        "fx_graph_cache": False, "benchmark_kernel": False, "triton.cudagraphs": False,
        "triton.native_matmul": bool(options.get("native_matmul")),
        "triton.persistent_reductions": bool(options.get("persistent", True)),
        **(_TEMPLATE_PATCHES if template else {}),
    }
    patches = {k: v for k, v in patches.items() if _has_option(inductor_config, k)}
    from unittest import mock

    missed: list[str] = []
    selection = _one_template(missed) if template else contextlib.nullcontext()
    with inductor_config.patch(patches), mock.patch.object(GraphLowering, "compile_to_module", capture), \
            mock.patch.object(GraphLowering, "save_output_code", lambda code: None), _unsplit_scans(), selection, \
            mode:
        # compile_fx_inner lowers what it is given: the graph must first be in Inductor's own decomposed form (gelu,
        # softmax and clamp are decompositions there, not lowerings), as compile_fx's aot_autograd pass makes it.
        gm = make_fx(gm, decomposition_table=select_decomp_table(), tracing_mode="real")(*inputs)
        compile_fx_inner(gm, inputs)
    if missed:
        raise SeedUnavailable(missed[0])
    if not codes:
        raise SeedUnavailable("Inductor generated no code for this problem")
    return codes[-1]


# Max-autotune's GEMM and convolution lowerings, offered Triton templates, with nothing that would need a device to
# benchmark or a binary to run: the choice among the templates is :func:`_one_template`'s, made without timing.
# TMA and persistent templates are left out: their descriptors are made on the host by Inductor's runtime, which a
# self-contained seed does not carry, and the interpreter cannot run them.
_TEMPLATE_PATCHES: dict[str, Any] = {
    "max_autotune_gemm_backends": "ATEN,TRITON",
    "max_autotune_conv_backends": "ATEN,TRITON",
    "max_autotune_gemm_search_space": "DEFAULT",
    "benchmark_epilogue_fusion": False,
    "pipeline_max_autotune_gemm": False,
    "autotune_in_subproc": False,
    "epilogue_fusion": True,
    "prologue_fusion": False,
    "triton.enable_persistent_tma_matmul": False,
    "triton.enable_template_tma_store": False,
    "triton.enable_tma_load_for_template_epilogue": False,
    "triton.num_decompose_k_splits": 0,
}


def _one_template(missed: list[str]) -> Any:
    """Max-autotune's selection reduced to one Triton template choice, without benchmarking.

    Inductor returns a lone choice without timing it. Where a lowering offers no Triton template (a dilated or
    transposed convolution, float64), its ATen choice is kept so that the lowering completes, and ``missed`` says
    why the variant has no seed."""
    from unittest import mock

    from torch._inductor import select_algorithm

    original = select_algorithm.AlgorithmSelectorCache.__call__
    template_caller = select_algorithm.TritonTemplateCaller

    def select(self: Any, name: str, choices: list[Any], *args: Any, **kwargs: Any) -> Any:
        templates = [c for c in choices if isinstance(c, template_caller) and _plain_template(c)]
        if not templates:
            missed.append(f"Inductor offers no Triton template for {name} (its choices: "
                          f"{', '.join(sorted({_choice_kind(c) for c in choices})) or 'none'})")
            return original(self, name, choices[:1], *args, **kwargs)
        return original(self, name, [_heuristic_choice(templates)], *args, **kwargs)

    return mock.patch.object(select_algorithm.AlgorithmSelectorCache, "__call__", select)


# Names of Inductor's GEMM templates whose kernels need what a seed cannot carry: TMA descriptors made on the host,
# a persistent workspace, or Blackwell's warp specialisation.
_UNSUPPORTED_TEMPLATE = re.compile(r"tma|persistent|blackwell|tlx|cutedsl", re.IGNORECASE)
# An H100's shared memory per block and SM count (the stand-in device's), where the device does not say.
_SMEM_LIMIT = 232448
_SMS = 132


def _plain_template(choice: Any) -> bool:
    """A Triton template choice whose kernel is self-contained: no TMA, no workspace, no mutated inputs."""
    return (not _UNSUPPORTED_TEMPLATE.search(choice.name) and getattr(choice, "workspace_arg", None) is None
            and not getattr(choice, "mutated_inputs", None))


def _choice_kind(choice: Any) -> str:
    if hasattr(choice, "make_kernel_render"):
        return f"Triton template {choice.name}"
    kind = "ATen" if "Extern" in type(choice).__name__ else type(choice).__name__
    return f"{kind} {getattr(choice, 'name', '')}".strip()


def _choice_args(choice: Any) -> dict[str, int]:
    """A template choice's integer constexprs (BLOCK_M, BLOCK_K, ...) and its warps and stages, from the
    description Inductor gives every choice (``BLOCK_K=16, BLOCK_M=32, ..., num_stages=1, num_warps=2``)."""
    out: dict[str, int] = {}
    for key, val in re.findall(r"(\w+)=(-?\d+)\b(?![.'])", str(getattr(choice, "description", ""))):
        out[key] = int(val)
    return out


def _smem_bytes(choice: Any, args: dict[str, int]) -> int:
    """Shared memory a GEMM-like template's pipeline holds: one A and one B tile per stage."""
    try:
        itemsize = int(choice.input_nodes[0].get_dtype().itemsize)
    except (AttributeError, IndexError, TypeError):
        itemsize = 4
    bm, bn, bk = args.get("BLOCK_M", 0), args.get("BLOCK_N", 0), args.get("BLOCK_K", 0)
    return (bm * bk + bk * bn) * max(1, args.get("num_stages", 1)) * itemsize


def _output_numel(choice: Any) -> int:
    try:
        return max(1, math.prod(int(s) for s in choice.layout.size))
    except (AttributeError, TypeError, ValueError):
        return 1  # a symbolic size: every tile is as good as another


def _device_limits() -> tuple[int, int]:
    """(shared memory per block, SMs) of the device the code is generated for."""
    import torch

    try:
        props = torch.cuda.get_device_properties(0)
        return int(props.shared_memory_per_block_optin), int(props.multi_processor_count)
    except (AttributeError, RuntimeError, AssertionError, TypeError, ValueError):
        return _SMEM_LIMIT, _SMS


def _heuristic_choice(choices: list[Any]) -> Any:
    """The template configuration a seed starts from, chosen without timing anything.

    Among the configurations that fit the device's shared memory, the largest output tile that still gives every SM a
    program (a large GEMM's usual best), or where no tile does (a small problem), the one with the most programs.
    Ties keep Inductor's own order. The search moves warps and stages from there."""
    smem, sms = _device_limits()

    def score(i: int) -> tuple[int, int, int]:
        args = _choice_args(choices[i])
        tile = max(1, args.get("BLOCK_M", 1) * args.get("BLOCK_N", 1))
        programs = -(_output_numel(choices[i]) // -tile)
        fills = programs >= sms
        return (1 if fills else 0, tile if fills else -tile, -i)

    fitting = [i for i, c in enumerate(choices) if _smem_bytes(c, _choice_args(c)) <= smem]
    return choices[max(fitting or range(len(choices)), key=score)]


def _has_option(cfg: Any, dotted: str) -> bool:
    obj = cfg
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


# --------------------------------------------------------------------------------------------- reading the wrapper


def read_wrapper(src: str) -> InductorProgram:
    """The plan of Inductor's wrapper ``src``: kernels, and the forward's allocations, views and launches."""
    tree = ast.parse(src)
    kernels: dict[str, KernelPlan] = {}
    helpers: dict[str, str] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and _dotted(node.value.func) == "async_compile.triton"):
            kname = node.targets[0].id  # type: ignore[attr-defined]
            ksrc = node.value.args[1].value  # type: ignore[attr-defined]
            kernels[kname] = read_kernel(kname, ksrc, helpers)
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"), None)
    if call is None:
        raise SeedUnavailable("Inductor's wrapper has no call() function")
    prog = InductorProgram()
    order: dict[str, int] = {}
    _read_body(call.body, prog, kernels, order)
    prog.helpers = list(helpers.values())
    if not prog.kernels:
        raise SeedUnavailable("Inductor launches no Triton kernel for this problem")
    return prog


def _read_body(body: list[ast.stmt], prog: InductorProgram, kernels: dict[str, KernelPlan],
               order: dict[str, int]) -> None:
    for st in body:
        if isinstance(st, ast.With):
            _read_body(st.body, prog, kernels, order)
            continue
        if isinstance(st, ast.Delete):
            continue
        if isinstance(st, ast.Return):
            vals = st.value.elts if isinstance(st.value, (ast.Tuple, ast.List)) else [st.value]
            prog.outputs = [_expr(v) for v in vals if v is not None]
            continue
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            tgt, val = st.targets[0], st.value
            if isinstance(tgt, (ast.Tuple, ast.List)) and isinstance(val, ast.Name) and val.id == "args":
                prog.inputs = [e.id for e in tgt.elts]  # type: ignore[attr-defined]
                continue
            if isinstance(tgt, ast.Name) and isinstance(val, ast.Name) and val.id == "args":
                prog.inputs = [tgt.id]
                continue
            if isinstance(tgt, ast.Name) and isinstance(val, ast.Call):
                fn = _dotted(val.func)
                if fn in _SKIPPED_ASSIGNS:
                    continue
                if fn in _ALLOC_CALLS:
                    size, stride = (list(ast.literal_eval(a)) for a in val.args[:2])
                    dtype = _dotted(val.args[2]) if len(val.args) > 2 else "torch.float32"
                    prog.steps.append({"alloc": tgt.id, "size": size, "stride": stride, "dtype": dtype})
                    continue
                if fn == "reinterpret_tensor":
                    prog.steps.append({"code": f"{tgt.id} = {_expr(val)}"})
                    continue
            if isinstance(tgt, ast.Name) and isinstance(val, ast.Name):
                prog.steps.append({"code": f"{tgt.id} = {val.id}"})  # a buffer reused under another name
                continue
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            call = st.value
            fn = _dotted(call.func)
            if fn in _SKIPPED_CALLS:
                continue
            if fn.endswith(".run") and fn[: -len(".run")] in kernels:
                _launch(call, fn[: -len(".run")], prog, kernels, order)
                continue
            if fn.endswith(".zero_") and isinstance(call.func, ast.Attribute):
                _zero(prog, _dotted(call.func.value))
                continue
        raise SeedUnavailable(f"Inductor's wrapper runs `{_short(ast.unparse(st))}`, which is not a Triton kernel")


def _zero(prog: InductorProgram, buf: str) -> None:
    """``buf.zero_()`` after its allocation: the allocation becomes a zero-filled one of the same layout."""
    for step in prog.steps:
        if step.get("alloc") == buf:
            step["zero"] = True
            return
    raise SeedUnavailable(f"Inductor zeroes {buf}, which the seed did not allocate")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


def _expr(node: ast.AST) -> str:
    """A wrapper argument as Python for the seed's forward: a name, a number, or a view of a buffer."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return repr(node.value)
    if isinstance(node, ast.Call) and _dotted(node.func) == "reinterpret_tensor":
        base, size, stride = (_expr(node.args[0]), ast.literal_eval(node.args[1]), ast.literal_eval(node.args[2]))
        offset = ast.literal_eval(node.args[3]) if len(node.args) > 3 else 0
        return f"{base}.as_strided({tuple(size)!r}, {tuple(stride)!r}, {base}.storage_offset() + {offset})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return repr(-node.operand.value)
    raise SeedUnavailable(f"unsupported argument `{_short(ast.unparse(node))}` in Inductor's wrapper")


def _launch(call: ast.Call, kname: str, prog: InductorProgram, kernels: dict[str, KernelPlan],
            order: dict[str, int]) -> None:
    plan = kernels[kname]
    if kname not in order:
        order[kname] = len(prog.kernels)
        prog.kernels.append(plan)
    args = [_expr(a) for a in call.args]
    fixed: list[int] = []
    if plan.fixed_grid:
        # A template's grid comes last among its launch arguments, computed by Inductor for its block sizes.
        args, grid_args = args[: -plan.fixed_grid], args[-plan.fixed_grid:]
        if not all(re.fullmatch(r"\d+", g) for g in grid_args):
            raise SeedUnavailable(f"{kname}: its launch grid is not a constant (dynamic shapes are not supported)")
        fixed = [int(g) for g in grid_args] + [1] * (3 - len(grid_args))
    names = [p for p in plan.params if p not in plan.config_keys]
    if len(args) != len(names):
        raise SeedUnavailable(f"{kname}: {len(args)} launch arguments for {len(names)} parameters")
    numels = {}
    for n, a in zip(names, args):
        if n.endswith("numel"):
            if not re.fullmatch(r"-?\d+", a):
                raise SeedUnavailable(f"{kname}: {n} is not a constant (dynamic shapes are not supported)")
            numels[n] = int(a)
    step: dict[str, Any] = {"launch": order[kname], "args": args, "numels": numels}
    if fixed:
        step["grid"] = fixed
    prog.steps.append(step)


# --------------------------------------------------------------------------------------------- reading a kernel


def _unsplit_scans() -> Any:
    """Inductor's scans with one block per row instead of a split scan.

    A long scan over few rows becomes a split scan in Inductor's code: its blocks pass carries through a workspace
    with a decoupled look-back that spins on flags set by other blocks, which a seed cannot carry (and the
    interpreter, running blocks one after another, cannot judge). With one split the same scan is one looped
    reduction kernel per row, which renders like any other; the search then tunes its block sizes."""
    from unittest import mock

    from torch._inductor import ir

    if not hasattr(ir, "Scan") or not hasattr(ir.Scan, "num_splits"):
        return contextlib.nullcontext()
    original = ir.Scan.num_splits.__func__

    def one_split(cls: Any, *args: Any, **kwargs: Any) -> Any:
        hint, _ = original(cls, *args, **kwargs)
        return hint, 1

    return mock.patch.object(ir.Scan, "num_splits", classmethod(one_split))


def read_kernel(kname: str, src: str, helpers: dict[str, str]) -> KernelPlan:
    """Inductor's kernel module ``src``: the bare ``@triton.jit`` function (Inductor's runtime helpers vendored
    into ``helpers``), its parameters, and the configurations its heuristic would autotune over."""
    tree = ast.parse(src)
    local_jit = {}
    fn_node = None
    heuristic: ast.Call | None = None
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        decs = [_dotted(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list]
        if any(d.startswith("triton_heuristics.") for d in decs):
            fn_node = node
            heuristic = next(d for d in node.decorator_list if isinstance(d, ast.Call)
                             and _dotted(d.func).startswith("triton_heuristics."))
        elif "triton.jit" in decs:
            local_jit[node.name] = node
    if fn_node is None or heuristic is None:
        raise SeedUnavailable(f"{kname}: no Inductor-decorated Triton kernel in its module")
    kind = _dotted(heuristic.func).split(".")[-1]
    if kind not in _HEURISTICS and kind != "template":
        raise SeedUnavailable(f"{kname}: Inductor's {kind} kernels are not supported as seeds")
    kw = {k.arg: _eval_meta(k.value) for k in heuristic.keywords if k.arg and k.arg != "filename"}
    inductor_meta = kw.get("inductor_meta") or {}
    grid_type = inductor_meta.get("grid_type", "Grid1D")
    if grid_type not in GRID_TYPES:
        raise SeedUnavailable(f"{kname}: Inductor's {grid_type} launch grid is not supported")
    fixed_grid = list(inductor_meta.get("fixed_grid") or []) if grid_type == "FixedGrid" else []
    if kind == "template":
        _check_template(kname, ast.unparse(fn_node), inductor_meta, fixed_grid)
        configs = [LaunchConfig(kwargs={}, num_warps=int(kw["num_warps"]), num_stages=int(kw["num_stages"]))]
    else:
        configs = _configs(kind, kw)

    # Kernel-local jit helpers (a scan's combine function) get the kernel's name as a prefix; Inductor's runtime
    # helpers are vendored once under HELPER_PREFIX.
    local_names = {n: f"{kname}__{n}" for n in local_jit}
    runtime = _runtime_helper_closure("\n".join(ast.unparse(n) for n in [fn_node, *local_jit.values()]))
    for n in runtime:
        if n not in helpers:
            helpers[n] = _helper_source(n, runtime)
    for n, node in local_jit.items():
        helpers[local_names[n]] = _rename(node, local_names, runtime, new_name=local_names[n])
    body = _rename(fn_node, local_names, runtime)
    params = [a.arg for a in fn_node.args.args]
    constexpr = [a.arg for a in fn_node.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)]
    config_keys = sorted({k for c in configs for k in c.kwargs})
    missing = [p for p in constexpr if p not in config_keys]
    if missing:
        raise SeedUnavailable(f"{kname}: constexpr parameters {missing} are not set by Inductor's configs")
    template_blocks = {k: int(v) for k, v in (inductor_meta.get("config_args") or {}).items()
                       if k.startswith("BLOCK_") and isinstance(v, int) and not isinstance(v, bool)}
    return KernelPlan(name=kname, source=body, params=params, config_keys=config_keys, configs=configs,
                      grid_type=grid_type, kind=kind, no_x_dim=bool(inductor_meta.get("no_x_dim")),
                      persistent=kind == "persistent_reduction", fixed_grid=len(fixed_grid),
                      template_blocks=template_blocks if kind == "template" else {})


# What a template kernel may use that a self-contained seed cannot give it: descriptors Inductor's runtime makes on
# the host (TMA), and a workspace it allocates.
_HOST_MADE = re.compile(r"\b(make_tensor_descriptor|_experimental_descriptor|TensorDescriptor|tma_|workspace)\w*")


def _check_template(kname: str, src: str, inductor_meta: dict[str, Any], fixed_grid: list[str]) -> None:
    """A template kernel is a seed when its whole launch is in the wrapper's call: a fixed grid passed as the
    trailing launch arguments, and nothing made on the host."""
    if not fixed_grid or list(inductor_meta.get("extra_launcher_args") or []) != fixed_grid:
        raise SeedUnavailable(f"{kname}: Inductor's template launch grid is not a fixed one")
    found = _HOST_MADE.search(src)
    if found:
        raise SeedUnavailable(f"{kname}: Inductor's template uses {found.group(0)}, which a seed cannot carry")


def _eval_meta(node: ast.AST) -> Any:
    from torch._inductor.runtime import hints

    scope = {"DeviceProperties": hints.DeviceProperties, "ReductionHint": hints.ReductionHint,
             "TileHint": hints.TileHint, "AutotuneHint": hints.AutotuneHint, "set": set, "__file__": ""}
    return eval(compile(ast.Expression(node), "<inductor meta>", "eval"), scope)  # noqa: S307 - Inductor's own literals


def _configs(kind: str, kw: dict[str, Any]) -> list[LaunchConfig]:
    from torch._inductor.runtime import triton_heuristics

    fn = getattr(triton_heuristics, kind)
    try:
        raw = fn(**kw, filename=None, return_configs=True)
    except TypeError as e:
        raise SeedUnavailable(f"Inductor's {kind} heuristic does not list its configs here: {e}") from None
    out: list[LaunchConfig] = []
    for c in raw:
        lc = LaunchConfig(kwargs={k: int(v) for k, v in c.kwargs.items()}, num_warps=int(c.num_warps),
                          num_stages=int(c.num_stages))
        if lc not in out:
            out.append(lc)
    if not out:
        raise SeedUnavailable(f"Inductor's {kind} heuristic offered no configuration")
    return out


def _runtime_helper_closure(src: str) -> list[str]:
    """Inductor's runtime helpers (``triton_helpers.NAME``) a kernel calls, with the helpers they call, callees
    first."""
    from torch._inductor.runtime import triton_helpers

    todo = re.findall(r"\btriton_helpers\.(\w+)", src)
    seen: list[str] = []

    def visit(name: str) -> None:
        if name in seen:
            return
        obj = getattr(triton_helpers, name, None)
        fn = getattr(obj, "fn", None)
        if fn is None:
            raise SeedUnavailable(f"Inductor's runtime helper {name} is not a Triton function")
        tree = ast.parse(inspect.getsource(fn))
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and n.id != name and hasattr(getattr(triton_helpers, n.id, None), "fn"):
                visit(n.id)
        seen.append(name)

    for name in todo:
        visit(name)
    return seen


def _helper_source(name: str, runtime: list[str]) -> str:
    from torch._inductor.runtime import triton_helpers

    tree = ast.parse(inspect.getsource(getattr(triton_helpers, name).fn))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    return _rename(fn, {}, runtime, new_name=HELPER_PREFIX + name, runtime_module=True)


class _Renamer(ast.NodeTransformer):
    def __init__(self, local: dict[str, str], runtime: list[str], runtime_module: bool) -> None:
        self.local = local
        self.runtime = set(runtime)
        self.runtime_module = runtime_module

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name):
            if node.value.id == "triton_helpers" and node.attr in self.runtime:
                return ast.copy_location(ast.Name(HELPER_PREFIX + node.attr, ast.Load()), node)
            if node.value.id == "math" and self.runtime_module:  # triton_helpers' `math` is tl.math
                return ast.copy_location(ast.Attribute(ast.Name("tl_math", ast.Load()), node.attr, node.ctx), node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.local:
            return ast.copy_location(ast.Name(self.local[node.id], node.ctx), node)
        if self.runtime_module and node.id in self.runtime:
            return ast.copy_location(ast.Name(HELPER_PREFIX + node.id, node.ctx), node)
        return node


def _rename(fn: ast.FunctionDef, local: dict[str, str], runtime: list[str], new_name: str | None = None,
            runtime_module: bool = False) -> str:
    fn = _Renamer(local, runtime, runtime_module).visit(fn)
    fn.decorator_list = []
    if new_name:
        fn.name = new_name
    return "@triton.jit\n" + ast.unparse(fn)


# --------------------------------------------------------------------------------------------- entry point


def generate_in_process(problem_source: str, name: str, target: str, options: dict[str, Any]) -> InductorProgram:
    """Code generation and reading in this process (the worker side of :func:`generate`)."""
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    import torch

    if target == "cpu" or not torch.cuda.is_available():
        # The interpreter's seeds, and a GPU's seeds planned on a host without one (tests, ahead-of-time planning).
        from ks_inductor.seeds.inductor.fake_device import install

        install()
    src = wrapper_source(problem_source, name, options)
    if not options.get("template"):
        return read_wrapper(src)
    try:
        prog = read_wrapper(src)
    except SeedUnavailable as e:
        raise SeedUnavailable(f"Inductor's code with its Triton templates is no seed: {e}") from None
    if not any(k.kind == "template" for k in prog.kernels):
        raise SeedUnavailable("Inductor chose no Triton template for this problem")
    return prog


def preload() -> None:
    """What a generation imports, done once by the warm parent that forks the generations (``generate.py``). Nothing
    here may touch a device or Inductor's state: each generation starts from this parent's memory."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch._inductor.codegen.triton  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.decomposition  # noqa: F401
    import torch._inductor.graph  # noqa: F401
    import torch._subclasses.fake_tensor  # noqa: F401
    import torch.fx.experimental.proxy_tensor  # noqa: F401
    import triton  # noqa: F401

    import ks_inductor.problem_tracing  # noqa: F401
    import ks_inductor.seeds.inductor.fake_device  # noqa: F401


def serve_forked(fd: int) -> None:
    """A forked generation: the job on stdin, the plans as JSON on ``fd``."""
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(_run(json.loads(sys.stdin.read()))))


def main() -> int:
    sys.stdout.write(json.dumps(_run(json.loads(sys.stdin.read()))))
    return 0


def _run(job: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant, options in job["variants"].items():
        try:
            prog = generate_in_process(job["source"], job["name"], job["target"], options)
            out[variant] = {"program": prog.to_json()}
        except SeedUnavailable as e:
            out[variant] = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - Inductor failing on a graph is a reason, not a crash
            out[variant] = {"error": f"Inductor could not generate code: {type(e).__name__}: {_short(str(e))}"}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
