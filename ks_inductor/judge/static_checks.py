"""Static safety rules for candidate source: the one place they are written down.

An AST pass (never regex), run before any device time is spent and again on every kernel a pack carries. What a
name check cannot see (a torch op reached through a tensor method or an operator) the worker's runtime guard
catches; these rules close the doors that would let a candidate switch that guard off. The doors are closed by what
an expression does, not by what its names are called: an alias (``t = torch; t.os``) reaches the same module, so
module reach, hooks and state are recognised by the attribute or the mutation itself, whatever the base.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ks_inductor.candidate import parse_source

# Modules a candidate may import. Everything else (os, sys, ctypes, threading, gc, inspect, importlib, socket, ...)
# is refused: candidates compute with Triton, allocate with torch, and do nothing else.
ALLOWED_IMPORTS = ("torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "math", "typing",
                   "functools", "__future__", "dataclasses", "enum", "operator", "itertools")
_THREAD_MODULES = ("threading", "multiprocessing", "concurrent", "asyncio", "_thread")
_IO_MODULES = ("os", "sys", "io", "pathlib", "shutil", "socket", "subprocess", "urllib", "http", "requests",
               "ctypes", "cffi", "pickle", "marshal", "tempfile", "signal", "mmap", "builtins", "importlib",
               "gc", "inspect", "time", "resource", "sqlite3")
# Attribute names under which an allowed import hands out a module of the interpreter, the OS or the judge without
# an import statement: torch.os, typing.sys, enum.bltns (builtins), torch.nn.functional.np (numpy),
# dataclasses._thread, torch.ctypes._os, torch.multiprocessing.reducer, ... (the names found by walking the allowed
# modules' attributes seven levels deep), and the judge's own packages. Refused on any base expression, so an alias
# of the base does not help.
_MODULE_ATTRS = frozenset({
    "os", "_os", "sys", "_sys", "builtins", "bltns", "inspect", "threading", "_thread", "ctypes", "gc", "importlib",
    "subprocess", "socket", "_socket", "signal", "io", "pathlib", "shutil", "tempfile", "pickle", "copyreg", "marshal",
    "multiprocessing", "python_multiprocessing", "mp", "reducer", "reduction", "concurrent", "asyncio", "resource",
    "mmap", "weakref", "traceback", "types", "_types", "time", "glob", "platform", "sysconfig", "pkgutil", "atexit",
    "warnings", "_warnings", "logging", "linecache", "tokenize", "dis", "ast", "tarfile", "zipfile", "gzip", "np",
    "numpy", "ks_inductor", "kernel_cache",
})
# The judge's own state: its allow-lists, and the interpreter's table of loaded modules through which they are found.
_JUDGE_STATE = frozenset({"ALLOWED_IMPORTS", "TORCH_ALLOWED_CALLS", "COMPUTE_METHODS", "ALLOWED_ATEN", "modules"})
# nn.Module methods whose names start like a hook registration and only add a member.
_MEMBER_REGISTRATION = frozenset({"register_buffer", "register_parameter", "register_module"})
# Reading or writing files and loading native code through torch or numpy objects.
_FILE_ATTRS = frozenset({"from_file", "tofile", "fromfile", "dump", "load_library", "load_inline", "cpp_extension"})
# operator's doors to dynamic attribute access and to mutation by function call.
_DYNAMIC_ACCESS = frozenset({"attrgetter", "methodcaller", "setitem", "delitem"})
# torch namespaces a candidate has no business touching: compilers, dispatch, files, processes, hooks on torch itself.
_TORCH_OFF_LIMITS = frozenset({"ops", "backends", "library", "_C", "_dynamo", "_inductor", "utils", "hub", "jit",
                               "serialization", "package", "classes", "overrides", "load", "save", "from_file",
                               "multiprocessing", "distributed"})

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

# Methods that change the object they are called on: containers (put is a queue's) and nn.Module members. Tensor
# methods ending in "_" (copy_, fill_, ...) change their tensor in place too.
_MUTATORS = frozenset({
    "update", "setdefault", "append", "extend", "insert", "add", "pop", "popitem", "clear", "remove", "discard",
    "put", "put_nowait", "appendleft", "extendleft", "popleft", "rotate", "reverse", "difference_update",
    "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__", "__iadd__", "__ior__",
    "register_buffer", "register_parameter", "register_module", "add_module",
})
_MUTABLE_CONSTRUCTORS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque",
                                   "Counter", "ChainMap", "SimpleNamespace"})
# Builtins whose call returns a new object that holds nothing of the caller's state but copies of it.
_FRESH_CALLS = frozenset({"dict", "list", "set", "bytearray", "tuple", "frozenset", "sorted", "range", "len", "int",
                          "float", "bool", "str", "abs", "round", "divmod"})
# Methods that return a new object rather than a view of, or an element of, their receiver.
_FRESH_METHODS = frozenset({"copy", "clone", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"})
_BUILTIN_TYPES = frozenset({"dict", "list", "set", "bytearray", "object", "type"})


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


def _is_hook_name(name: str) -> bool:
    """Hook registration by its name: forward/backward/pre/post hooks of a module, of every module at once (which
    hands the trials the reference's outputs), of a tensor, of dispatch, and torch's private registries."""
    low = name.lower()
    return "hook" in low or low.startswith("_register_") or (low.startswith("register_")
                                                              and low not in _MEMBER_REGISTRATION)


def _mutable_default(node: ast.AST) -> bool:
    """A default argument holding a mutable container: built once, when the function is defined, and shared by
    every call."""
    for n in ast.walk(node):
        if isinstance(n, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            return True
        if isinstance(n, ast.Call) and (dotted_name(n.func) or "").split(".")[-1] in _MUTABLE_CONSTRUCTORS:
            return True
    return False


def _bound_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (not those it only reads, as in ``out[i] = ...``)."""
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _own_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.AST]:
    """The nodes of a function's body, nested functions and classes left out (they are scopes of their own)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(c for c in ast.iter_child_nodes(n)
                    if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
    return out


@dataclass
class _Frame:
    """A function being checked: what its receiver is called, its locals, and which of them hold objects it made."""
    name: str
    self_name: str | None = None  # the instance: a method's first parameter (nested functions see it too)
    cls_name: str | None = None   # the class: a classmethod's first parameter
    params: set[str] = field(default_factory=set)
    locals: set[str] = field(default_factory=set)
    fresh: set[str] = field(default_factory=set)


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.findings: list[tuple[str, str]] = []
        self.aliases: dict[str, str] = {}  # local name -> module path (import torch.nn.functional as F)
        self.module_aliases: set[str] = set()  # the aliases that name a module rather than something in one
        self.jit_kernels: set[str] = set()
        self.launched: set[str] = set()
        self.module_names: set[str] = set()  # bound at module level: state that outlives a call
        self.class_names: set[str] = set()
        self.bound: set[str] = set()  # every name the source binds anywhere (parameters included)
        self.parents: dict[ast.AST, ast.AST] = {}
        self._in_jit = 0
        self._func_stack: list[str] = []
        self._frames: list[_Frame] = []
        self._class_body: list[bool] = []  # per enclosing scope, innermost last: is it a class body

    def flag(self, flag: str, reason: str, node: ast.AST | None = None) -> None:
        where = f" (line {node.lineno})" if node is not None and hasattr(node, "lineno") else ""
        item = (flag, reason + where)
        if item not in self.findings:
            self.findings.append(item)

    def prepass(self, tree: ast.Module) -> None:
        """What the module binds, read before any rule runs: a function may come before the global it changes."""
        for n in ast.walk(tree):
            for c in ast.iter_child_nodes(n):
                self.parents[c] = n
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                self.bound.add(n.id)
            elif isinstance(n, ast.arg):
                self.bound.add(n.arg)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(n.name)
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.module_names.add(stmt.name)
                if isinstance(stmt, ast.ClassDef):
                    self.class_names.add(stmt.name)
                continue
            self.module_names.update(n.id for n in ast.walk(stmt)
                                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))

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
        for name in mod.split("."):
            self._check_name(name, node)

    def _check_name(self, name: str, node: ast.AST) -> None:
        """The rules on an attribute's or an imported name, whatever it is reached through."""
        if name in _MODULE_ATTRS or name in _JUDGE_STATE:
            self.flag("module_reach", f"reaches {name}: no interpreter, OS or judge modules or state, however "
                      "they are reached", node)
        elif _is_hook_name(name):
            self.flag("hook", f"uses {name}: no hooks (a module hook is handed the reference's outputs)", node)
        elif name in _DYNAMIC_ACCESS or name in _FILE_ATTRS:
            self.flag("forbidden_builtin", f"uses {name}: no dynamic attribute access, file access or native code",
                      node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(a.name, node)
            local = a.asname or a.name.split(".")[0]
            self.aliases[local] = a.name if a.asname else local
            self.module_aliases.add(local)

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
            self._check_name(a.name, node)
            self.aliases[a.asname or a.name] = full
            if full in ALLOWED_IMPORTS:
                self.module_aliases.add(a.asname or a.name)

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return dotted
        return base + ("." + rest if rest else "")

    def _library_rooted(self, node: ast.AST) -> bool:
        name = dotted_name(node)
        return name is not None and name.split(".")[0] in self.aliases

    def _names_module(self, node: ast.AST) -> bool:
        """Whether an expression is an imported module itself (``operator``, ``torch.nn``): its ``add`` or
        ``update`` is a function of the module, not a method changing a container."""
        name = dotted_name(node)
        return name is not None and (name in self.module_aliases or self._resolve(name) in ALLOWED_IMPORTS)

    # -- definitions
    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, name: str) -> None:
        outer = self._frames[-1] if self._frames else None
        frame = _Frame(name, outer.self_name if outer else None, outer.cls_name if outer else None)
        args = node.args
        params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        positional = [a.arg for a in args.posonlyargs + args.args]
        if self._class_body and self._class_body[-1] and positional and not isinstance(node, ast.Lambda):
            decorators = {(dotted_name(d) or "").split(".")[-1] for d in node.decorator_list}
            if "classmethod" in decorators:
                frame.cls_name, frame.self_name = positional[0], None
            elif "staticmethod" not in decorators:
                frame.self_name = positional[0]
        self._find_fresh(node, frame, params)
        if isinstance(node, ast.Lambda):
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if _mutable_default(default):
                    self.flag("result_cache", "a default argument of a lambda is a mutable container, kept across "
                              "calls", node)
        self._func_stack.append(name)
        self._frames.append(frame)
        self._class_body.append(False)

    def _leave(self) -> None:
        self._class_body.pop()
        self._frames.pop()
        self._func_stack.pop()

    def _find_fresh(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, frame: _Frame,
                    params: set[str]) -> None:
        """Locals bound only to objects the function makes itself (``out = torch.empty(...)``, ``dims = [1] * n``),
        never to something it was handed or reached (a parameter, ``c = self.cache``, a loop variable)."""
        bindings: dict[str, list[ast.AST | None]] = {}
        for n in _own_nodes(node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        bindings.setdefault(t.id, []).append(n.value)
                    elif (isinstance(t, (ast.Tuple, ast.List)) and isinstance(n.value, (ast.Tuple, ast.List))
                          and len(t.elts) == len(n.value.elts)):
                        for el, v in zip(t.elts, n.value.elts):
                            for x in _bound_names(el):
                                bindings.setdefault(x, []).append(v if isinstance(el, ast.Name) else None)
                    else:
                        for x in _bound_names(t):
                            bindings.setdefault(x, []).append(None)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
                bindings.setdefault(n.target.id, []).append(n.value)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.NamedExpr, ast.comprehension)):
                for x in _bound_names(n.target):
                    bindings.setdefault(x, []).append(None)
            elif isinstance(n, (ast.With, ast.AsyncWith)):
                for item in n.items:
                    for x in _bound_names(item.optional_vars) if item.optional_vars is not None else ():
                        bindings.setdefault(x, []).append(None)
        frame.params = params
        frame.locals = params | set(bindings)
        frame.fresh = set(bindings) - params
        changed = True
        while changed:
            changed = False
            for name in sorted(frame.fresh):
                if not all(v is not None and self._makes_new(v, frame) for v in bindings[name]):
                    frame.fresh.discard(name)
                    changed = True

    def _makes_new(self, value: ast.AST, frame: _Frame) -> bool:
        """Whether an expression evaluates to an object made during this call, holding none of the state that
        outlives it."""
        if isinstance(value, ast.Name):
            return value.id in frame.fresh
        if isinstance(value, ast.IfExp):
            return self._makes_new(value.body, frame) and self._makes_new(value.orelse, frame)
        if isinstance(value, ast.BoolOp):
            return all(self._makes_new(v, frame) for v in value.values)
        if isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Name):
                return func.id in _FRESH_CALLS and func.id not in self.bound
            if isinstance(func, ast.Attribute):
                # A library call (torch.empty, math.ceil) or a copying method returns a new object; any other
                # method (a view, .get of a cache) returns its receiver's or part of it.
                return self._library_rooted(func) or func.attr in _FRESH_METHODS or self._makes_new(func.value,
                                                                                                    frame)
            return False
        # Displays, comprehensions and arithmetic make new objects; a reference reaches an existing one.
        return not isinstance(value, (ast.Attribute, ast.Subscript, ast.Starred, ast.NamedExpr, ast.Await,
                                      ast.Yield, ast.YieldFrom))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        is_jit = any(_is_jit_decorator(d) for d in node.decorator_list)
        if is_jit:
            self.jit_kernels.add(node.name)
        for d in node.decorator_list:
            name = (dotted_name(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1]
            if name in _CACHE_DECORATORS:
                self.flag("result_cache", f"@{name} caches results across calls", node)
            self.visit(d)
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.flag("lazy_evaluation", f"defines {node.name}: tensor subclasses that defer work", node)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            if _mutable_default(default):
                self.flag("result_cache", f"a default argument of {node.name} is a mutable container, kept across "
                          "calls", node)
        self._enter(node, node.name)
        self._in_jit += is_jit
        for child in [node.args, *node.body] + ([node.returns] if node.returns else []):
            self.visit(child)
        self._in_jit -= is_jit
        self._leave()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._enter(node, "<lambda>")
        self.generic_visit(node)
        self._leave()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            name = self._resolve(dotted_name(b) or "")
            if name in ("torch.Tensor", "Tensor"):
                self.flag("lazy_evaluation", f"class {node.name} subclasses torch.Tensor", node)
            if name.split(".")[-1] == "Model":
                self.flag("calls_reference", f"class {node.name} inherits the reference Model", node)
        self._class_body.append(True)
        self.generic_visit(node)
        self._class_body.pop()

    # -- statements
    def visit_Try(self, node: ast.AST) -> None:
        self.flag("try_except_fallback", "try/except is not allowed: a fallback path can hide a failing kernel",
                  node)
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Global(self, node: ast.AST) -> None:
        self.flag("stateful", "global/nonlocal state can carry results across calls", node)

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    # -- state: a call may change only what it made
    def _kept(self, obj: ast.AST, tensor_write: bool = False) -> tuple[str, str] | None:
        """Where the object that ``obj`` evaluates to lives when that outlives the running call, as ``(flag,
        description)``; None for an object the running function made (or reaches through views of one).

        Module-level code and ``__init__`` build state (that is their job); every other function may change only
        objects it made: not a module-level name, the class, the instance, a parameter, a closure's variable, nor
        anything reached through them, however the reference was passed along. A tensor write (an in-place method,
        a store through slices) into a parameter is the one exception: a helper fills the buffer it is handed."""
        frame = self._frames[-1] if self._frames else None
        if frame is None or self._in_jit:
            return None
        text = ast.unparse(obj)
        node, reached = obj, False
        while True:
            if isinstance(node, ast.Attribute):
                if node.attr == "__class__":
                    return "result_cache", f"the class ({text})"
                node, reached = node.value, True
            elif isinstance(node, ast.Subscript):
                node, reached = node.value, True
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if self._library_rooted(node.func) or node.func.attr in _FRESH_METHODS:
                    return None
                node = node.func.value  # a method's result: a view of its receiver, or part of it
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("type", "super"):
                    return "result_cache", f"the class ({text})"
                if node.func.id in _FRESH_CALLS and not reached:
                    return None
                return "result_cache", f"{text}, which may be an object kept across calls"
            else:
                break
        if not isinstance(node, ast.Name):
            return None
        name = node.id
        if name == frame.self_name:
            return None if frame.name == "__init__" else ("stateful", f"the instance ({text})")
        if name == frame.cls_name or (name in self.class_names and name not in frame.locals):
            return "result_cache", f"the class ({text})"
        if name in frame.fresh:
            return ("stateful", f"{text}, an object reached through {name}") if reached else None
        if tensor_write and name in frame.params and not reached:
            return None
        if name in self.aliases and name not in frame.locals:
            return "monkeypatch", f"the module {self._resolve(name)} ({text})"
        if name in frame.locals:
            return "stateful", f"{text}, which {frame.name} did not make"
        if name in self.module_names:
            return "result_cache", f"module-level {text}"
        if name in _BUILTIN_TYPES:
            return "result_cache", f"its argument, through {text}"
        return "result_cache", f"{text}, a variable of an enclosing scope"

    def _check_change(self, obj: ast.AST, node: ast.AST, how: str, tensor_write: bool = False) -> None:
        kept = self._kept(obj, tensor_write)
        if kept is not None:
            flag, what = kept
            self.flag(flag, f"{self._func_stack[-1]} {how} {what}: results must not be kept across calls", node)

    def _check_store(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t, node)
            return
        if isinstance(target, ast.Starred):
            self._check_store(target.value, node)
            return
        if isinstance(target, ast.Attribute):
            dotted = dotted_name(target) or ""
            root = self._resolve(dotted).split(".")[0]
            if root in ("torch", "triton", "math", "functools", "operator") or dotted.split(".")[0] in self.aliases:
                self.flag("monkeypatch", f"assigns {dotted}: no patching of torch, triton or timers", node)
            if target.attr.startswith("__"):
                self.flag("monkeypatch", f"assigns dunder attribute {target.attr}", node)
            self._check_change(target.value, node, f"sets .{target.attr} on")
        if isinstance(target, ast.Subscript):
            sliced = any(isinstance(n, ast.Slice) or (isinstance(n, ast.Constant) and n.value is Ellipsis)
                         for n in ast.walk(target.slice))
            self._check_change(target.value, node, "writes into", tensor_write=sliced)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_store(t, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)):
                self._check_change(t.value, node, "deletes from")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self._in_jit:
            self.flag("torch_compute", "uses the @ operator outside a Triton kernel (a torch matmul)", node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        parent = self.parents.get(node)
        read_through = isinstance(parent, ast.Attribute) and parent.value is node
        if isinstance(node.ctx, ast.Load) and node.id in self.module_aliases and not read_through:
            self.flag("module_reach", f"uses the module {node.id} as a value: modules are read through their "
                      "attributes only (an alias would get past the rules that read names)", node)
        if isinstance(node.ctx, ast.Load) and node.id in _DANGEROUS_BUILTINS and node.id not in self.bound and \
                not (isinstance(parent, ast.Call) and parent.func is node):
            self.flag("forbidden_builtin", f"refers to {node.id}: no exec/eval/file access/dynamic attributes",
                      node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("__") and node.attr not in ("__init__", "__name__", "__class__", "__future__"):
            self.flag("introspection", f"touches {node.attr}: no interpreter introspection", node)
        elif node.attr == "__class__" and isinstance(node.ctx, ast.Store):
            self.flag("monkeypatch", "reassigns __class__", node)
        self._check_name(node.attr, node)
        parent = self.parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if node.attr in _MUTATORS and not called and not self._in_jit and not self._names_module(node.value):
            # A bound mutator handed out (fill = CACHE.update) changes its object wherever it is called later.
            frame = self._frames[-1] if self._frames else None
            if not (frame and isinstance(node.value, ast.Name) and node.value.id in frame.fresh):
                self.flag("result_cache", f"takes .{node.attr} of {ast.unparse(node.value)} as a value: results "
                          "must not be kept across calls", node)
        dotted = dotted_name(node)
        if dotted:
            full = self._resolve(dotted)
            parts = full.split(".")
            if dotted.split(".")[0] in self.aliases and any(p.startswith("_") and not p.startswith("__")
                                                             for p in parts):
                self.flag("introspection", f"touches private {full}", node)
            if parts[0] == "torch" and parts[-1] in _STREAM_NAMES:
                self.flag("side_stream", f"uses {full}: all work must run on the current stream", node)
            if parts[0] == "torch" and len(parts) > 1 and parts[1] in _TORCH_OFF_LIMITS:
                self.flag("forbidden_torch_call", f"touches {full}", node)
            if full in ALLOWED_IMPORTS and dotted != full.split(".")[0] and not (
                    isinstance(parent, ast.Attribute) and parent.value is node):
                self.flag("module_reach", f"uses the module {full} as a value: modules are read through their "
                          "attributes only", node)
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
        if isinstance(func, ast.Attribute) and not self._in_jit and not self._names_module(func.value):
            if self._library_rooted(func.value):
                # A container living in a library (not a function of it) would keep results across calls, and
                # across candidates; in-place torch functions (nn.init.normal_) change only their argument.
                if func.attr in _MUTATORS:
                    self.flag("monkeypatch", f"calls .{func.attr}() on {ast.unparse(func.value)}: a library's "
                              "state is not the candidate's to change", node)
            elif func.attr in _MUTATORS:
                self._check_change(func.value, node, f"calls .{func.attr}() on")
            elif func.attr.endswith("_") and not func.attr.startswith("_"):
                self._check_change(func.value, node, f"calls .{func.attr}() on", tensor_write=True)
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
            elif func.attr in COMPUTE_METHODS and root not in self._triton_lang_aliases() and not (
                    self._names_module(func.value)):  # math.sqrt, operator.add: functions on numbers
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
    c.prepass(tree)
    c.visit(tree)
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree)):
        c.flag("no_modelnew", "no class ModelNew: the candidate must define ModelNew(nn.Module)")
    if not c.jit_kernels:
        c.flag("no_triton_kernel", "no @triton.jit kernel is defined")
    elif not (c.jit_kernels & c.launched):
        c.flag("kernel_not_launched", f"Triton kernels {sorted(c.jit_kernels)} are defined but never launched "
               "with kernel[grid](...)")
    return c.findings
