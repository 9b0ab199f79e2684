"""Static safety rules for candidate source: the one place they are written down.

An AST pass (never regex), run before any device time is spent and again on every kernel a pack carries. What a
name check cannot see (a torch op reached through a tensor method or an operator) the worker's runtime guard
catches; these rules close the doors that would let a candidate switch that guard off.
"""

from __future__ import annotations

import ast

from ks_inductor.candidate import parse_source

# Modules a candidate may import. Everything else (os, sys, ctypes, threading, gc, inspect, importlib, socket, ...)
# is refused: candidates compute with Triton, allocate with torch, and do nothing else.
ALLOWED_IMPORTS = ("torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "math", "typing",
                   "functools", "__future__", "dataclasses", "enum", "operator", "itertools")
_THREAD_MODULES = ("threading", "multiprocessing", "concurrent", "asyncio", "_thread")
_IO_MODULES = ("os", "sys", "io", "pathlib", "shutil", "socket", "subprocess", "urllib", "http", "requests",
               "ctypes", "cffi", "pickle", "marshal", "tempfile", "signal", "mmap", "builtins", "importlib",
               "gc", "inspect", "time", "resource", "sqlite3")

# torch calls that allocate, describe or view memory; anything else under torch.* computes (or reaches into the
# framework) and is refused.
TORCH_ALLOWED_CALLS = frozenset({
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like", "torch.ones",
    "torch.ones_like", "torch.full", "torch.full_like", "torch.arange", "torch.tensor", "torch.device",
    "torch.Size", "torch.finfo", "torch.iinfo", "torch.is_tensor", "torch.no_grad", "torch.inference_mode",
    "torch.get_default_dtype", "torch.manual_seed",
    "torch.cuda.current_device", "torch.cuda.get_device_properties", "torch.cuda.device_count",
    "torch.cuda.is_available", "torch.cuda.get_device_capability", "torch.cuda.get_device_name",
    "torch.nn.Parameter", "torch.nn.Module", "torch.nn.ModuleList", "torch.nn.ParameterList",
})
# Tensor methods that compute. Operators (a @ b, a * b) and methods not listed here are caught at run time.
COMPUTE_METHODS = frozenset({
    "sum", "mean", "matmul", "mm", "bmm", "addmm", "baddbmm", "softmax", "log_softmax", "exp", "log", "relu",
    "sigmoid", "tanh", "gelu", "silu", "pow", "sqrt", "rsqrt", "max", "min", "amax", "amin", "argmax", "argmin",
    "norm", "var", "std", "prod", "cumsum", "cumprod", "mul", "add", "sub", "div", "abs", "neg", "clamp",
    "where", "masked_fill", "topk", "sort", "einsum", "conv2d", "linear", "logsumexp", "layer_norm", "sin", "cos",
    "erf", "reciprocal", "square", "mul_", "add_", "sub_", "div_", "exp_", "addcmul", "lerp", "maximum",
    "minimum", "gather", "scatter", "index_select", "dot", "outer", "tril", "triu", "flip", "roll",
})
_DANGEROUS_BUILTINS = frozenset({"exec", "eval", "compile", "open", "__import__", "globals", "locals", "vars",
                                 "getattr", "setattr", "delattr", "input", "breakpoint", "memoryview"})
_CACHE_DECORATORS = frozenset({"lru_cache", "cache", "cached_property"})
_STREAM_NAMES = frozenset({"Stream", "stream", "set_stream", "ExternalStream", "wait_stream", "record_stream",
                           "StreamContext"})


def dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit_decorator(dec: ast.AST) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = dotted_name(target) or ""
    return name.split(".")[-1] in ("jit", "autotune", "heuristics") and ("triton" in name or name in ("jit",))


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.findings: list[tuple[str, str]] = []
        self.aliases: dict[str, str] = {}  # local name -> module path (import torch.nn.functional as F)
        self.jit_kernels: set[str] = set()
        self.launched: set[str] = set()
        self.module_names: set[str] = set()
        self._in_jit = 0
        self._func_stack: list[str] = []

    def flag(self, flag: str, reason: str, node: ast.AST | None = None) -> None:
        where = f" (line {node.lineno})" if node is not None and hasattr(node, "lineno") else ""
        item = (flag, reason + where)
        if item not in self.findings:
            self.findings.append(item)

    # -- imports
    def _check_module(self, mod: str, node: ast.AST) -> None:
        root = mod.split(".")[0]
        if root in _THREAD_MODULES:
            self.flag("thread_injection", f"imports {mod}: candidates may not start threads or processes", node)
        elif root in _IO_MODULES:
            self.flag("forbidden_import", f"imports {mod}: no file, network, process or interpreter access", node)
        elif not any(mod == a or mod.startswith(a + ".") for a in ALLOWED_IMPORTS):
            self.flag("forbidden_import", f"imports {mod}: only torch, triton and small stdlib helpers", node)
        elif mod.startswith(("triton.runtime", "triton.compiler", "triton.testing", "triton.knobs",
                             "triton.backends", "torch._", "torch.utils", "torch.cuda", "torch.library")):
            self.flag("forbidden_import", f"imports {mod}: framework internals are off limits", node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(a.name, node)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:
            self.flag("forbidden_import", "relative imports are not allowed", node)
        self._check_module(mod, node)
        for a in node.names:
            full = f"{mod}.{a.name}"
            if a.name == "*":
                self.flag("forbidden_import", f"star import from {mod}", node)
            elif mod in ("torch", "torch.nn", "triton") and a.name not in ("nn", "language", "jit", "autotune",
                                                                           "Config", "heuristics", "cdiv"):
                self._check_module(full, node)
            self.aliases[a.asname or a.name] = full

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return dotted
        return base + ("." + rest if rest else "")

    # -- definitions
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        is_jit = any(_is_jit_decorator(d) for d in node.decorator_list)
        if is_jit:
            self.jit_kernels.add(node.name)
        for d in node.decorator_list:
            name = (dotted_name(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1]
            if name in _CACHE_DECORATORS:
                self.flag("result_cache", f"@{name} caches results across calls", node)
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.flag("lazy_evaluation", f"defines {node.name}: tensor subclasses that defer work", node)
        self._in_jit += is_jit
        self._func_stack.append(node.name)
        self.generic_visit(node)
        self._func_stack.pop()
        self._in_jit -= is_jit

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            name = self._resolve(dotted_name(b) or "")
            if name in ("torch.Tensor", "Tensor"):
                self.flag("lazy_evaluation", f"class {node.name} subclasses torch.Tensor", node)
            if name.split(".")[-1] == "Model":
                self.flag("calls_reference", f"class {node.name} inherits the reference Model", node)
        self.generic_visit(node)

    # -- statements
    def visit_Try(self, node: ast.AST) -> None:
        self.flag("try_except_fallback", "try/except is not allowed: a fallback path can hide a failing kernel",
                  node)
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Global(self, node: ast.AST) -> None:
        self.flag("stateful", "global/nonlocal state can carry results across calls", node)

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    def _check_store(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t, node)
            return
        if isinstance(target, ast.Attribute):
            dotted = dotted_name(target) or ""
            root = self._resolve(dotted).split(".")[0]
            if root in ("torch", "triton", "math", "functools", "operator") or dotted.split(".")[0] in self.aliases:
                self.flag("monkeypatch", f"assigns {dotted}: no patching of torch, triton or timers", node)
            if dotted.startswith("self.") and self._func_stack and self._func_stack[-1] == "forward":
                self.flag("stateful", f"forward stores {dotted}: results must not be kept across calls", node)
            if target.attr.startswith("__"):
                self.flag("monkeypatch", f"assigns dunder attribute {target.attr}", node)
        if isinstance(target, ast.Subscript) and self._func_stack and not self._in_jit:
            base = dotted_name(target.value) or ""
            if base and base.split(".")[0] in self.module_names:
                self.flag("result_cache", f"writes into module-level {base}: no result caching", node)
            if base.startswith("self.") and self._func_stack[-1] == "forward":
                self.flag("stateful", f"forward writes into {base}: results must not be kept across calls", node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if not self._func_stack:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.module_names.add(t.id)
        for t in node.targets:
            self._check_store(t, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target, node)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self._in_jit:
            self.flag("torch_compute", "uses the @ operator outside a Triton kernel (a torch matmul)", node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("__") and node.attr not in ("__init__", "__name__", "__class__", "__future__"):
            self.flag("introspection", f"touches {node.attr}: no interpreter introspection", node)
        elif node.attr == "__class__" and isinstance(node.ctx, ast.Store):
            self.flag("monkeypatch", "reassigns __class__", node)
        dotted = dotted_name(node)
        if dotted:
            full = self._resolve(dotted)
            parts = full.split(".")
            if parts[0] in ("torch", "triton") and any(p.startswith("_") and not p.startswith("__") for p in parts):
                self.flag("introspection", f"touches private {full}", node)
            if parts[0] == "torch" and parts[-1] in _STREAM_NAMES:
                self.flag("side_stream", f"uses {full}: all work must run on the current stream", node)
            if parts[0] == "torch" and len(parts) > 1 and parts[1] in ("ops", "backends", "library", "_C",
                                                                        "_dynamo", "_inductor", "utils"):
                self.flag("forbidden_torch_call", f"touches {full}", node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Subscript):
            name = dotted_name(func.value)
            if name:
                self.launched.add(name.split(".")[-1])
        if isinstance(func, ast.Name) and func.id in _DANGEROUS_BUILTINS:
            self.flag("forbidden_builtin", f"calls {func.id}(): no exec/eval/file access/dynamic attributes",
                      node)
        if isinstance(func, ast.Name) and func.id == "Model":
            self.flag("calls_reference", "instantiates the reference Model", node)
        dotted = dotted_name(func) if isinstance(func, ast.Attribute) else None
        if dotted and not self._in_jit:
            full = self._resolve(dotted)
            root = full.split(".")[0]
            if full.split(".")[-1] == "is_current_stream_capturing":
                self.flag("capture_aware", f"calls {full}: a kernel must compute the same way inside a CUDA graph "
                          "as outside it", node)
            if root == "torch":
                allowed = full in TORCH_ALLOWED_CALLS or full.startswith("torch.nn.init.") or (
                    full.startswith("torch.nn.") and full.split(".")[2][:1].isupper() and len(full.split(".")) == 3
                )
                if not allowed:
                    self.flag("torch_compute", f"calls {full}: torch may allocate and view, not compute", node)
            elif root == "triton":
                if full.startswith(("triton.testing", "triton.runtime", "triton.compiler", "triton.knobs")):
                    self.flag("forbidden_torch_call", f"calls {full}", node)
            elif func.attr in COMPUTE_METHODS and root not in self._triton_lang_aliases():
                self.flag("torch_compute", f"calls .{func.attr}() on a tensor outside a Triton kernel", node)
            if func.attr in ("forward",) and isinstance(func.value, ast.Call):
                base = dotted_name(func.value.func) or ""
                if base == "super":
                    self.flag("calls_reference", "calls super().forward", node)
        self.generic_visit(node)

    def _triton_lang_aliases(self) -> set[str]:
        return {k for k, v in self.aliases.items() if v.startswith("triton")}


def static_check(source: str) -> list[tuple[str, str]]:
    """Return ``(flag, reason)`` pairs for every rule the source breaks; an empty list means clean."""
    try:
        tree = parse_source(source)
    except SyntaxError as e:
        return [("syntax_error", f"syntax error at line {e.lineno}: {e.msg}")]
    c = _Checker()
    c.visit(tree)
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree)):
        c.flag("no_modelnew", "no class ModelNew: the candidate must define ModelNew(nn.Module)")
    if not c.jit_kernels:
        c.flag("no_triton_kernel", "no @triton.jit kernel is defined")
    elif not (c.jit_kernels & c.launched):
        c.flag("kernel_not_launched", f"Triton kernels {sorted(c.jit_kernels)} are defined but never launched "
               "with kernel[grid](...)")
    return c.findings
