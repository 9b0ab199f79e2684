"""The seams in ks_inductor.contracts: the real cache, judge and executor classes satisfy their protocols, and the
functions on each seam are annotated with them."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

from kernel_cache.access import open_store
from kernel_cache.lazy_store import LazyKernelStore
from kernel_cache.store import KernelStore
from ks_inductor import contracts as C
from ks_inductor.judge import Judge
from ks_inductor.warm.parallel import LockedStore, RegionThreads
from ks_inductor.warm.ray_cluster import RayExecutor
from ks_inductor.warm.rooms import RegionQueue

_PROTOCOL_NOISE = {"__init__", "__class_getitem__", "__init_subclass__", "__subclasshook__", "__weakref__",
                   "__dict__", "__module__", "__doc__", "__annotations__", "__parameters__", "__orig_bases__",
                   "__abstractmethods__", "__protocol_attrs__", "__non_callable_proto_members__"}


def _members(proto: type) -> dict[str, Any]:
    """The protocol's members and where each is declared: a function, a property, or an annotation (a data
    attribute)."""
    out: dict[str, Any] = {}
    for base in reversed(proto.__mro__):
        if base is object or not getattr(base, "_is_protocol", False) or base.__name__ == "Protocol":
            continue
        for name in getattr(base, "__annotations__", {}):
            out[name] = "attribute"
        for name, value in vars(base).items():
            if name.startswith("_") and name not in ("__enter__", "__exit__"):
                continue
            if name not in _PROTOCOL_NOISE and (inspect.isfunction(value) or isinstance(value, property)):
                out[name] = value
    return out


def _assigned_in_init(cls: type) -> set[str]:
    """The ``self.x`` an ``__init__`` of the class (or its bases) assigns."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                        names.add(el.attr)
    return names


def _parameters(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def unmet(cls: type, proto: type) -> list[str]:
    """What ``cls`` lacks of ``proto``, structurally: each method with the protocol's parameters, in order, as the
    first of its own; each property as something readable; each attribute on the class or set by its
    ``__init__`` (or, on a dataclass, one of its fields)."""
    missing = []
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    for name, decl in _members(proto).items():
        if decl == "attribute":
            if not (hasattr(cls, name) or name in fields or name in _assigned_in_init(cls)):
                missing.append(f"{name} (attribute)")
            continue
        have = inspect.getattr_static(cls, name, None)
        if have is None:
            missing.append(name)
        elif isinstance(decl, property):
            if not isinstance(have, property) and name not in _assigned_in_init(cls):
                missing.append(f"{name} (readable)")
        elif not callable(have):
            missing.append(f"{name} (not a method)")
        else:
            want, got = _parameters(decl), _parameters(have)
            if got[:len(want)] != want:
                missing.append(f"{name}{tuple(want)} but {name}{tuple(got)}")
    return missing


@pytest.mark.parametrize(("cls", "proto"), [
    (KernelStore, C.SearchStore), (KernelStore, C.CompileStore), (LazyKernelStore, C.CompileStore),
    (Judge, C.SearchJudge), (Judge, C.RoomJudge),
    (RegionThreads, C.RegionExecutor), (RayExecutor, C.RegionExecutor), (RegionQueue, C.RegionSource),
])
def test_the_real_classes_satisfy_their_protocols(cls: type, proto: type) -> None:
    assert unmet(cls, proto) == []


def test_a_class_missing_a_method_or_with_other_parameters_is_caught() -> None:
    class HalfJudge:
        fingerprint = None
        device_count = 1
        backend = None

        def submit(self, problem, code, final=False):  # other names, other order
            pass

    lacks = unmet(HalfJudge, C.SearchJudge)
    assert any(m.startswith("submit(") for m in lacks) and {"evaluate", "release", "close"} <= set(lacks)


def test_stores_opened_for_real_are_the_protocols_at_run_time(tmp_path) -> None:
    with open_store(str(tmp_path / "k.db")) as store:
        assert isinstance(store, C.SearchStore) and isinstance(store, C.CompileStore)
        assert isinstance(LockedStore(store), C.SearchStore)
    lazy = open_store(str(tmp_path / "k.db"), lazy=True)
    try:
        assert isinstance(lazy, C.CompileStore)
        assert lazy.fast, "checking the compile's store against its protocol opened SQLAlchemy's store"
    finally:
        lazy.close()
    assert isinstance(RegionThreads(), C.RegionExecutor) and isinstance(RayExecutor(db=str(tmp_path / "k.db")),
                                                                        C.RegionExecutor)


def _annotation(fn: Any, param: str) -> str:
    return str(inspect.signature(fn).parameters[param].annotation)


@pytest.mark.parametrize(("fn", "param", "proto"), [
    ("ks_inductor.warm.run:warm", "store", "SearchStore"),
    ("ks_inductor.warm.run:warm", "judge", "SearchJudge"),
    ("ks_inductor.warm.run:warm", "executor", "RegionExecutor"),
    ("ks_inductor.warm.run:apply_outcome", "store", "SearchStore"),
    ("ks_inductor.warm.region:evolve_region", "store", "SearchStore"),
    ("ks_inductor.warm.region:evolve_region", "judge", "SearchJudge"),
    ("ks_inductor.warm.parallel:RegionThreads.run", "regions", "RegionSource"),
    ("ks_inductor.warm.parallel:RegionThreads.run", "store", "SearchStore"),
    ("ks_inductor.warm.ray_cluster:RayExecutor.run", "regions", "RegionSource"),
    ("ks_inductor.warm.ray_cluster:RayExecutor.run", "store", "SearchStore"),
    ("ks_inductor.warm.rooms:RegionQueue.__init__", "judge", "RoomJudge"),
    ("ks_inductor.warm.rooms:RegionQueue.__init__", "store", "SearchStore"),
    ("ks_inductor.warm.sources:problems_from_model", "store", "CompileStore"),
    ("ks_inductor.warm.sources:problems_from_misses", "store", "SearchStore"),
    ("ks_inductor.evolve.evolver:evolve_problem", "store", "SearchStore"),
    ("ks_inductor.evolve.evolver:evolve_problem", "judge", "SearchJudge"),
    ("ks_inductor.evolve.evolver:Evolver.__init__", "store", "SearchStore"),
    ("ks_inductor.evolve.evolver:Evolver.__init__", "judge", "SearchJudge"),
    ("ks_inductor.compiler.backend:analyze", "store", "CompileStore"),
    ("ks_inductor.compiler.explain:explain", "store", "CompileStore"),
    ("ks_inductor.compiler.graph_guard:GuardPlan.make", "store", "CompileStore"),
])
def test_the_seams_are_annotated_with_their_protocols(fn: str, param: str, proto: str) -> None:
    import importlib

    module, _, path = fn.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    assert proto in _annotation(obj, param), f"{fn}({param}: {_annotation(obj, param)})"


_LIBRARY = ("ks_core", "kernel_cache", "ks_inductor", "integrations")


def _problem_slot(annotation: ast.expr, nested: bool = True) -> ast.expr:
    """What stands for the problem itself in an annotation: ``X`` of ``X | None``, of ``list[X]``, ``Sequence[X]``
    and the like, and a mapping's values as they are written (``dict[str, Any]`` there is a problem's JSON)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        left, right = annotation.left, annotation.right
        return _problem_slot(right if isinstance(left, ast.Constant) and left.value is None else left, nested)
    if nested and isinstance(annotation, ast.Subscript):
        args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if len(args) == 2 and not isinstance(args[1], ast.Constant):  # a mapping: its values
            return _problem_slot(args[1], nested=False)
        return _problem_slot(args[0])
    return annotation


def untyped_problems(source: str, filename: str = "<source>") -> list[str]:
    """Where a parameter or a field named ``problem`` or ``problems`` has ``Any`` where the problem stands (alone,
    or as the items of a container): the record every part shares has a type, ``ks_core.problem_record.Problem``.
    A problem's JSON (``dict[str, Any]`` as a mapping's value) is no problem object and passes."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        named: list[tuple[str, ast.expr | None, int]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = [(x.arg, x.annotation, x.lineno) for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
            name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
            named = [(name, node.annotation, node.lineno)]
        for name, annotation, line in named:
            slot = None if annotation is None else _problem_slot(annotation)
            if name in ("problem", "problems") and isinstance(slot, ast.Name) and slot.id == "Any":
                found.append((line, f"{filename}:{line} {name}: {ast.unparse(annotation)}"))
    return [hit for _, hit in sorted(found)]


def test_no_problem_on_a_seam_is_typed_any() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = [hit for pkg in _LIBRARY for f in sorted((root / pkg).rglob("*.py"))
             for hit in untyped_problems(f.read_text(), str(f.relative_to(root)))]
    assert not found, "problems typed Any: " + "; ".join(found)


def test_an_untyped_problem_is_found() -> None:
    src = ("def f(problem: Any, other: Any): ...\n"
           "class R:\n    problems: list[Any] = []\n    problem: Problem | None = None\n"
           "def g(problem: Problem, problems: Sequence[Problem]): ...\n"
           "def h(problem: Any | None, problems: dict[str, Any]): ...\n"
           "def j(problems: dict[str, dict[str, Any]], problem: Optional[Problem]): ...\n")
    assert untyped_problems(src) == ["<source>:1 problem: Any", "<source>:3 problems: list[Any]",
                                     "<source>:6 problem: Any | None", "<source>:6 problems: dict[str, Any]"]
