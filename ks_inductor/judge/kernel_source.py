"""The part of a candidate that the trusted side runs: its Triton kernels, and nothing else of its source.

A launch plan (``plan.py``) names the kernels it launches; the trusted process that executes it builds them from
the candidate's source, never from anything the candidate's own process made. What it keeps of that source is a
module of its own making:

* imports of Triton's language (``triton``, ``triton.language``, its ``math`` and ``extra.libdevice`` modules) and of
  ``math``, under the names the candidate gave them;
* module-level constants whose values are literals (numbers, strings, ``tl.constexpr(literal)``, arithmetic of
  those and of earlier constants);
* every function decorated with ``triton.jit`` (other decorators, an autotuner's or heuristics', are dropped: the
  plan carries the launch parameters they chose).

A kernel body then runs under Triton's compiler on a GPU and under the interpreter on a CPU, where it is plain
Python. So a body is held to what Triton's language is, structurally rather than by a list of forbidden names: no
name or attribute that starts with an underscore, no call of a builtin other than the few Triton's frontend
evaluates (``range``, ``min``, ``len``, ...), and every attribute chain that starts at a module stays inside Triton's
language modules. ``tl.core.builtins.eval`` is refused because ``tl.core`` is not one of them, whatever it is called.
"""

from __future__ import annotations

import ast
import importlib
import types
from typing import Any

# Modules a kernel module may import, and those an attribute chain may pass through.
_LANGUAGE_MODULES = ("triton", "triton.language", "triton.language.core", "triton.language.standard",
                     "triton.language.math", "triton.language.extra",
                     "triton.language.extra.libdevice", "triton.language.extra.cuda",
                     "triton.language.extra.cuda.libdevice", "math")
# Builtins Triton's frontend evaluates in a kernel body (or that the interpreter needs for the same code).
_BODY_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "bool", "abs", "tuple", "isinstance",
                            "print", "enumerate", "zip", "list", "str", "round", "divmod", "pow", "all", "any",
                            "sum", "reversed", "slice", "True", "False", "None"})
_JIT_DECORATORS = frozenset({"jit"})


def _value_attrs() -> frozenset[str]:
    import triton.language as tl

    names = {"dtype", "shape", "type", "element_ty", "numel", "primitive_bitwidth", "int_bitwidth", "name",
             "fp_mantissa_width", "exponent_bias", "value", "address_space", "int_signedness", "block_shape"}
    classes = [tl.tensor, tl.dtype, tl.pointer_type, tl.block_type, tl.constexpr]
    classes += [c for c in (getattr(tl, "tensor_descriptor", None), getattr(tl, "tensor_descriptor_base", None)) if c]
    names |= {"block_type"}
    for cls in classes:
        names |= {a for a in dir(cls) if not a.startswith("_")}
    # A tensor's handle is the interpreter's numpy array or the compiler's IR value: below the language.
    return frozenset(names - {"handle"})


_VALUE_ATTRS = _value_attrs()
_DROPPED_DECORATORS = frozenset({"autotune", "heuristics"})


class KernelSourceError(ValueError):
    """The candidate's kernels cannot be taken apart from the rest of its source, or a body leaves Triton's
    language."""


def _decorator_name(d: ast.expr) -> str:
    target = d.func if isinstance(d, ast.Call) else d
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    return ""


def _is_dtype(module: str, attr: str) -> bool:
    import triton.language as tl

    return isinstance(getattr(importlib.import_module(module), attr, None), tl.dtype)


def _literal(node: ast.expr, constants: set[str], tl_names: dict[str, str]) -> bool:
    """A value built from literals, earlier constants and ``tl.constexpr(...)`` / ``tl.<dtype>`` of those."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal(e, constants, tl_names) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand, constants, tl_names)
    if isinstance(node, ast.BinOp):
        return _literal(node.left, constants, tl_names) and _literal(node.right, constants, tl_names)
    if isinstance(node, ast.Attribute):
        # tl.float32 and the like: a dtype of a language module, never a module or a function.
        return (isinstance(node.value, ast.Name) and node.value.id in tl_names and not node.attr.startswith("_")
                and _is_dtype(tl_names[node.value.id], node.attr))
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Attribute) and node.func.attr == "constexpr"
                and isinstance(node.func.value, ast.Name) and node.func.value.id in tl_names
                and not node.keywords and all(_literal(a, constants, tl_names) for a in node.args))
    return False


def _jit_decorators(fn: ast.FunctionDef) -> list[ast.expr] | None:
    """The decorators kept for ``fn`` (its ``triton.jit``), or None when it is no kernel."""
    names = [_decorator_name(d) for d in fn.decorator_list]
    if not any(n in _JIT_DECORATORS for n in names):
        return None
    kept = []
    for d, n in zip(fn.decorator_list, names):
        if n in _JIT_DECORATORS:
            if isinstance(d, ast.Call) and not all(isinstance(a, ast.Constant) or
                                                   (isinstance(a, (ast.List, ast.Tuple)) and all(
                                                       isinstance(e, ast.Constant) for e in a.elts))
                                                   for a in [*d.args, *(k.value for k in d.keywords)]):
                raise KernelSourceError(f"kernel {fn.name}: triton.jit takes literal arguments only")
            kept.append(d)
        elif n not in _DROPPED_DECORATORS:
            raise KernelSourceError(f"kernel {fn.name}: decorator {n or '?'} is not one of triton's")
    return kept


class _BodyCheck(ast.NodeVisitor):
    """Holds a kernel body to Triton's language (see the module's docstring)."""

    def __init__(self, kernel: str, modules: dict[str, str], known: set[str]) -> None:
        self.kernel, self.modules, self.known = kernel, modules, known
        self.local: set[str] = set()

    def fail(self, node: ast.AST, why: str) -> None:
        raise KernelSourceError(f"kernel {self.kernel}, line {getattr(node, 'lineno', '?')}: {why}")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__"):
            self.fail(node, f"name {node.id!r} starts with a double underscore")
        if isinstance(node.ctx, ast.Store):
            self.local.add(node.id)
        elif node.id not in self.local and node.id not in self.known and node.id not in _BODY_BUILTINS:
            self.fail(node, f"{node.id!r} is neither a kernel argument, a local, a kernel, a constant nor one of "
                      "Triton's modules")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        chain.reverse()
        for attr in chain:
            if attr.startswith("_"):
                self.fail(node, f"attribute {attr!r} starts with an underscore")
        if isinstance(base, ast.Name) and base.id in self.modules and base.id not in self.local:
            self._module_chain(node, self.modules[base.id], chain)
        else:
            self._value_chain(node, chain)
        self.visit(base)

    def _value_chain(self, node: ast.AST, chain: list[str]) -> None:
        """Attributes of a value of the language (a tensor, a dtype, a constexpr) are the language's own."""
        for attr in chain:
            if attr not in _VALUE_ATTRS:
                self.fail(node, f"attribute {attr!r} is not one of a Triton tensor's, dtype's or constexpr's")

    def _module_chain(self, node: ast.AST, module: str, chain: list[str]) -> None:
        """Every module an attribute chain from a module passes through is one of Triton's language modules. The
        chain is resolved here as Python would (a class of the language, ``tl.PropagateNan.ALL``, is fine); an
        attribute that does not resolve is left to Triton to refuse."""
        obj: Any = importlib.import_module(module)
        for attr in chain:
            if not hasattr(obj, attr):
                return
            obj = getattr(obj, attr)
            if isinstance(obj, types.ModuleType) and obj.__name__ not in _LANGUAGE_MODULES:
                self.fail(node, f"{'.'.join(chain)} reaches module {obj.__name__}, outside Triton's language")

    def visit_arg(self, node: ast.arg) -> None:
        if node.arg.startswith("__"):
            self.fail(node, f"argument {node.arg!r} starts with a double underscore")
        if node.annotation is not None:
            self.visit(node.annotation)  # evaluated when the module is built
        self.local.add(node.arg)

    def _no_nested(self, node: ast.AST) -> None:
        self.fail(node, "a kernel defines no functions, classes or lambdas of its own")

    visit_Lambda = visit_ClassDef = visit_AsyncFunctionDef = _no_nested  # type: ignore[assignment]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name != self.kernel:
            self._no_nested(node)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.fail(node, "a kernel changes no global")

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    def visit_Import(self, node: ast.AST) -> None:
        self.fail(node, "a kernel imports nothing")

    visit_ImportFrom = visit_Import  # type: ignore[assignment]


def kernels_module(source: str) -> str:
    """The module the trusted side builds the candidate's kernels from (see the module's docstring). Raises
    :class:`KernelSourceError` with a one-line reason."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise KernelSourceError(f"the candidate does not parse: {e.msg} (line {e.lineno})") from None
    body: list[ast.stmt] = []
    modules: dict[str, str] = {}
    constants: set[str] = set()
    kernels: list[ast.FunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _LANGUAGE_MODULES:
                    name = alias.asname or alias.name.split(".")[0]
                    modules[name] = alias.name if alias.asname else alias.name.split(".")[0]
                    body.append(ast.Import(names=[alias]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in _LANGUAGE_MODULES:
                    modules[alias.asname or alias.name] = full
                    body.append(ast.ImportFrom(module=node.module, names=[alias], level=0))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if (node.value is not None and all(isinstance(t, ast.Name) for t in targets)
                    and _literal(node.value, constants, modules)):
                constants.update(t.id for t in targets)  # type: ignore[attr-defined]
                body.append(node)
        elif isinstance(node, ast.FunctionDef):
            kept = _jit_decorators(node)
            if kept is not None:
                node.decorator_list = kept
                kernels.append(node)
                body.append(node)
    if not kernels:
        raise KernelSourceError("the candidate defines no @triton.jit kernel at its top level")
    known = set(modules) | constants | {k.name for k in kernels}
    for k in kernels:
        _BodyCheck(k.name, modules, known).visit(k)
    module = ast.Module(body=body, type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module)) + "\n"


def kernel_names(source: str) -> list[str]:
    """The names of the kernels :func:`kernels_module` keeps."""
    tree = ast.parse(source)
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _jit_decorators(n) is not None]
