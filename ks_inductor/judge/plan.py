"""A candidate is what it launches: its forward recorded as a plan, and the plan executed by the trusted side.

The candidate's process (``candidate_job.run_record``, sandboxed) runs its forward at the problem's shapes on inputs
of its own drawing and records what the forward does to memory, in order:

* ``fill`` / ``arange``: an allocation (or a view of one) set by torch (``zeros``, ``full``, ``arange``, ``fill_``);
* ``copy``: torch copying one view into another (``copy_``, ``clone``, ``contiguous``, a dtype cast);
* ``launch``: a Triton kernel of the candidate's module, named, with its grid and every argument bound to a view
  of a storage, a scalar, a Triton dtype, or a tensor descriptor over a view.

A storage is an input of the forward (by position), a tensor of the model's own (its weights and buffers, carried as
bytes), a constant the forward made from host data (carried as bytes), or an allocation of the forward (fresh, and
poisoned, at every call). A view is a storage, an element offset, sizes, strides and a dtype. The outputs are views.

The trusted process (``plan_job.run_plan``) builds the kernels from the candidate's source
(``kernel_source.kernels_module``) and executes the plan with torch and Triton of its own, for every trial, every
timed call and every re-check. Nothing the candidate's Python does at those calls exists there: torch compute has no
word in a plan, a timer cannot be rebound, a call cannot look at its caller, and only the memory the plan names is
reachable by name. What the candidate's process says is only the plan, and the plan is checked like any input:
storages, views and kernel names are validated, and a plan that lies about what the forward does computes
something else, which the trials reject.

Two recordings on different inputs must agree: a forward whose launches depend on its inputs' values (a host read of
a tensor) cannot be planned, and is refused with that reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PLAN_FILE = "plan.json"
STATE_FILE = "plan_state.safetensors"
# Limits on what a plan may ask of the trusted side.
MAX_STEPS = 4096
MAX_GRID = 2**31 - 1
# Host data a forward turns into a tensor (``torch.tensor([...])``) is carried into the plan up to this size; a
# larger unknown storage is an allocation in the plan, which its kernels then read as poison.
CONST_BYTES = 1 << 20

# Creation ops and the value they fill with (None: left as allocated).
_CREATE = {"empty": None, "empty_like": None, "empty_strided": None, "new_empty": None, "new_empty_strided": None,
           "empty_permuted": None, "zeros": 0, "zeros_like": 0, "new_zeros": 0, "ones": 1, "ones_like": 1,
           "new_ones": 1, "full": "arg", "full_like": "arg", "new_full": "arg", "scalar_tensor": "arg0",
           "arange": "arange"}
# Ops that copy their input into a new tensor (``clone``, a cast) or into their first argument (``copy_``).
_COPY_NEW = frozenset({"clone", "_to_copy", "lift_fresh_copy", "contiguous"})
_FILLS = frozenset({"fill_", "zero_"})
# Ops that neither write memory nor compute: views and questions about a tensor.
_QUIET = frozenset({
    "view", "_unsafe_view", "reshape", "as_strided", "expand", "permute", "t", "transpose", "unsqueeze", "squeeze",
    "slice", "select", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "narrow", "flatten",
    "unflatten", "view_as", "expand_as", "lift_fresh", "_local_scalar_dense", "is_same_size", "set_",
    "_reshape_alias", "stride", "size", "sym_size", "sym_stride", "sym_numel", "numel", "dim", "is_contiguous",
    "item", "_has_compatible_shallow_copy_type", "record_stream", "sym_storage_offset", "resize_", "to",
})


class PlanError(ValueError):
    """The forward cannot be planned, or a plan is malformed: one line that says why."""


@dataclass
class Plan:
    storages: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    version: int = 1

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "storages": self.storages, "steps": self.steps,
                           "outputs": self.outputs}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PlanError(f"the plan is not JSON: {e}") from None
        if not isinstance(d, dict) or d.get("version") != 1:
            raise PlanError("the plan is not a version 1 plan")
        plan = cls(storages=d.get("storages"), steps=d.get("steps"), outputs=d.get("outputs"))  # type: ignore[arg-type]
        plan.validate()
        return plan

    def same_launches(self, other: Plan) -> bool:
        return (self.storages, self.steps, self.outputs) == (other.storages, other.steps, other.outputs)

    def kernel_names(self) -> set[str]:
        return {s["kernel"] for s in self.steps if s.get("op") == "launch"}

    def launches(self) -> int:
        return sum(1 for s in self.steps if s.get("op") == "launch")

    def alloc_bytes(self) -> list[int]:
        return [s["nbytes"] for s in self.storages if s["kind"] == "alloc"]

    # -- validation: a plan comes from an untrusted process ---------------------------------------------------------

    def validate(self, n_inputs: int | None = None) -> None:
        if not isinstance(self.storages, list) or not isinstance(self.steps, list) or not isinstance(
                self.outputs, list):
            raise PlanError("the plan lacks storages, steps or outputs")
        if len(self.steps) > MAX_STEPS:
            raise PlanError(f"the plan has {len(self.steps)} steps, more than {MAX_STEPS}")
        for i, s in enumerate(self.storages):
            if not isinstance(s, dict) or s.get("kind") not in ("input", "state", "const", "alloc"):
                raise PlanError(f"storage {i} is of no known kind")
            if not _int(s.get("nbytes")) or s["nbytes"] < 0:
                raise PlanError(f"storage {i} has no size")
            if s["kind"] == "input" and (not _int(s.get("index")) or s["index"] < 0 or
                                         (n_inputs is not None and s["index"] >= n_inputs)):
                raise PlanError(f"storage {i} names no input")
        for i, step in enumerate(self.steps):
            if not isinstance(step, dict):
                raise PlanError(f"step {i} is not a step")
            op = step.get("op")
            if op == "fill":
                self._view(step.get("dst"))
                if not _scalar(step.get("value")):
                    raise PlanError(f"step {i} fills with no number")
            elif op == "arange":
                self._view(step.get("dst"))
                if not all(_number(step.get(k)) for k in ("start", "step")):
                    raise PlanError(f"step {i} is an arange without start and step")
            elif op == "copy":
                self._view(step.get("dst"))
                self._view(step.get("src"))
            elif op == "launch":
                if not isinstance(step.get("kernel"), str) or not step["kernel"].isidentifier():
                    raise PlanError(f"step {i} launches no named kernel")
                grid = step.get("grid")
                if not (isinstance(grid, list) and len(grid) == 3 and all(_int(g) and 0 <= g <= MAX_GRID
                                                                            for g in grid)):
                    raise PlanError(f"step {i} has a grid that is not three sizes")
                args = step.get("args")
                if not isinstance(args, dict) or not all(isinstance(k, str) and k.isidentifier() for k in args):
                    raise PlanError(f"step {i} has no named arguments")
                for a in args.values():
                    self._arg(a)
            else:
                raise PlanError(f"step {i} is of no known kind ({op!r})")
        if not self.outputs:
            raise PlanError("the plan returns nothing")
        for o in self.outputs:
            self._view(o)

    def _view(self, v: Any) -> None:
        if not isinstance(v, dict):
            raise PlanError("a view is not a view")
        sid = v.get("storage")
        if not _int(sid) or not 0 <= sid < len(self.storages):
            raise PlanError("a view names no storage")
        shape, stride, offset = v.get("shape"), v.get("stride"), v.get("offset")
        if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride)
                and all(_int(x) and x >= 0 for x in shape) and all(_int(x) for x in stride) and _int(offset)
                and offset >= 0):
            raise PlanError("a view has no sizes, strides and offset")
        itemsize = _itemsize(v.get("dtype"))
        if any(x < 0 for x in stride):
            raise PlanError("a view has a negative stride")
        extent = 0 if 0 in shape else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        if extent * itemsize > self.storages[sid]["nbytes"]:
            raise PlanError("a view reaches past its storage")

    def _arg(self, a: Any) -> None:
        if not isinstance(a, dict) or len(a) != 1:
            raise PlanError("a launch argument is not one of view, value, dtype, tuple or descriptor")
        (kind, val), = a.items()
        if kind == "t":
            self._view(val)
        elif kind == "v":
            if not (_scalar(val) or val is None or (isinstance(val, str) and len(val) < 64)):
                raise PlanError("a launch argument's value is not a number, a string or None")
        elif kind == "dtype":
            _tl_dtype(val)
        elif kind == "tuple":
            if not isinstance(val, list):
                raise PlanError("a tuple argument is not a list")
            for x in val:
                self._arg(x)
        elif kind == "desc":
            if not isinstance(val, dict):
                raise PlanError("a descriptor argument is malformed")
            self._view(val.get("base"))
            for k in ("shape", "strides", "block_shape"):
                if not (isinstance(val.get(k), list) and all(_int(x) for x in val[k])):
                    raise PlanError("a descriptor argument is malformed")
        else:
            raise PlanError(f"a launch argument is of no known kind ({kind!r})")


def _int(x: Any) -> bool:
    return type(x) is int


def _number(x: Any) -> bool:
    return type(x) in (int, float)


def _scalar(x: Any) -> bool:
    return type(x) in (int, float, bool) or (isinstance(x, str) and x in ("nan", "inf", "-inf"))


_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
           "int32": 4, "int64": 8, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "float8_e4m3fn": 1,
           "float8_e5m2": 1, "complex64": 8}


def _itemsize(name: Any) -> int:
    if name not in _DTYPES:
        raise PlanError(f"a view has no known dtype ({name!r})")
    return _DTYPES[name]


def _tl_dtype(name: Any) -> Any:
    import triton.language as tl

    try:
        return tl.dtype(name)
    except Exception:  # noqa: BLE001 - any failure means the name is no Triton dtype
        raise PlanError(f"a launch argument names no Triton dtype ({name!r})") from None


def _value(v: Any) -> Any:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def _jsonable_number(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    return v


# -- recording, in the candidate's process ----------------------------------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class _Recorder:
    """Storages and steps of one forward call, in the order they happen."""

    def __init__(self, inputs: Sequence[Any], state: Sequence[Any]) -> None:
        import torch

        self.storages: list[dict[str, Any]] = []
        self.by_ptr: dict[int, int] = {}
        self.payload: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self.compute: set[str] = set()
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes():
                self._add(x, {"kind": "input", "index": i})
        for t in state:
            ptr = t.untyped_storage().data_ptr()
            if t.untyped_storage().nbytes() and ptr not in self.by_ptr:
                sid = self._add(t, {"kind": "state"})
                self.payload[f"s{sid}"] = _storage_bytes(t)

    def _add(self, t: Any, desc: dict[str, Any]) -> int:
        st = t.untyped_storage()
        self.storages.append({**desc, "nbytes": st.nbytes()})
        sid = len(self.storages) - 1
        self.by_ptr[st.data_ptr()] = sid
        return sid

    def created(self, t: Any) -> None:
        """``t``'s memory is a new allocation of the forward."""
        self._add(t, {"kind": "alloc"})

    def view(self, t: Any) -> dict[str, Any]:
        st = t.untyped_storage()
        sid = self.by_ptr.get(st.data_ptr())
        if sid is None or self.storages[sid]["nbytes"] < st.nbytes():
            sid = self._unknown(t)
        return {"storage": sid, "offset": t.storage_offset(), "shape": list(t.shape), "stride": list(t.stride()),
                "dtype": _dtype_name(t.dtype)}

    def _unknown(self, t: Any) -> int:
        """Memory the forward reads that is neither an input, the model's nor made by a recorded op: host data
        turned into a tensor is carried (small); anything else is an allocation, whatever it held."""
        st = t.untyped_storage()
        if st.nbytes() <= CONST_BYTES:
            sid = self._add(t, {"kind": "const"})
            self.payload[f"s{sid}"] = _storage_bytes(t)
            return sid
        return self._add(t, {"kind": "alloc"})

    def arg(self, v: Any) -> dict[str, Any]:
        import torch
        import triton.language as tl

        if isinstance(v, torch.Tensor):
            return {"t": self.view(v)}
        if isinstance(v, tl.constexpr):
            v = v.value
        if isinstance(v, tl.dtype):
            return {"dtype": v.name}
        if isinstance(v, tuple):
            return {"tuple": [self.arg(x) for x in v]}
        if v is None or type(v) in (int, float, bool, str):
            return {"v": _jsonable_number(v)}
        desc = _descriptor(v)
        if desc is not None:
            return {"desc": {"base": self.view(desc.base), "shape": [int(x) for x in desc.shape],
                             "strides": [int(x) for x in desc.strides],
                             "block_shape": [int(x) for x in desc.block_shape],
                             "padding": str(getattr(desc, "padding", "zero"))}}
        raise PlanError(f"a kernel argument of type {type(v).__name__} has no place in a plan")


def _storage_bytes(t: Any) -> Any:
    import torch

    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (st.nbytes(),), (1,)).detach().cpu().clone()


def _descriptor(v: Any) -> Any:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return v if isinstance(v, TensorDescriptor) else None


def _grid3(grid: Any, meta: dict[str, Any]) -> list[int]:
    if callable(grid):
        grid = grid(meta)
    g = [int(x) for x in (grid if isinstance(grid, (tuple, list)) else (grid,))]
    return (g + [1, 1, 1])[:3]


class _Tracing:
    """While active: torch's ops (a dispatch mode) and Triton's launches (the ``run`` entry points) go to one
    recorder."""

    def __init__(self, rec: _Recorder | None, kernel_of: Callable[[Any], str | None], launch: bool = True) -> None:
        self.rec, self.kernel_of, self.launch = rec, kernel_of, launch
        self._originals: list[tuple[Any, Any]] = []
        self._mode: Any = None

    def __enter__(self) -> _Tracing:
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self.rec

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                _record_op(rec, func, args, kwargs or {}, out)
                return out

        self._mode = _Ops() if rec is not None else None
        if self._mode is not None:
            self._mode.__enter__()
        from triton.runtime.jit import JITFunction

        targets: list[Any] = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            targets.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in targets:
            original = cls.run
            self._originals.append((cls, original))
            cls.run = self._wrap(original)
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, original in self._originals:
            cls.run = original
        self._originals.clear()
        if self._mode is not None:
            self._mode.__exit__(*exc)

    def _wrap(self, original: Any) -> Any:
        tracing = self

        def run(fn: Any, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
            from torch.utils._python_dispatch import _disable_current_modes

            if not warmup and tracing.rec is not None:
                tracing._launch(fn, args, grid, kwargs)
            if not tracing.launch:
                return None
            # What the launch itself does with torch (the interpreter copies storages to the host and back) is not
            # the forward's.
            with _disable_current_modes():
                return original(fn, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    def _launch(self, fn: Any, args: tuple, grid: Any, kwargs: dict[str, Any]) -> None:
        name = self.kernel_of(fn)
        if name is None:
            raise PlanError(f"kernel {getattr(fn, '__name__', '?')} is not defined at the top of the candidate's "
                            "module")
        names = list(fn.arg_names)
        if len(args) > len(names):
            raise PlanError(f"kernel {name} is given more arguments than it takes")
        named = dict(zip(names, args))
        named.update(kwargs)
        # The mode would see the views a grid function or an argument's conversion makes; those are not the
        # forward's.
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            grid3 = _grid3(grid, dict(named))
            bound = {k: self.rec.arg(v) for k, v in named.items()}
        self.rec.steps.append({"op": "launch", "kernel": name, "grid": grid3, "args": bound})


def _record_op(rec: _Recorder, func: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
    import torch

    name = func.overloadpacket.__name__
    base = name.rstrip("_") if name not in _FILLS else name
    if name in _QUIET or base in _QUIET:
        return
    if name in _CREATE:
        if not isinstance(out, torch.Tensor):
            return
        rec.created(out)
        how = _CREATE[name]
        if how is None:
            return
        if how == "arange":
            start, step = _arange_args(func, args, kwargs)
            rec.steps.append({"op": "arange", "dst": rec.view(out), "start": start, "step": step})
            return
        value = how
        if how == "arg":
            value = kwargs["fill_value"] if "fill_value" in kwargs else args[2 if name == "new_full" else 1]
        elif how == "arg0":
            value = args[0]
        rec.steps.append({"op": "fill", "dst": rec.view(out), "value": _jsonable_number(_plain(value))})
        return
    if name in _FILLS:
        value = 0 if name == "zero_" else _plain(args[1])
        rec.steps.append({"op": "fill", "dst": rec.view(args[0]), "value": _jsonable_number(value)})
        return
    if name == "copy_":
        rec.steps.append({"op": "copy", "dst": rec.view(args[0]), "src": rec.view(args[1])})
        return
    if name in _COPY_NEW and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
        src = rec.view(args[0])
        rec.created(out)
        rec.steps.append({"op": "copy", "dst": rec.view(out), "src": src})
        return
    rec.compute.add(name)


def _plain(v: Any) -> Any:
    import torch

    if isinstance(v, torch.Tensor):
        return v.item()
    return v


def _arange_args(func: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    overload = func._overloadname
    if overload == "default":
        return 0, 1
    if overload == "start":
        return _plain(args[0]), 1
    return _plain(args[0]), _plain(args[2]) if len(args) > 2 else 1


def state_tensors(model: Any) -> list[Any]:
    """Every tensor a model holds: parameters, buffers, and tensors kept as attributes (alone, or in a list, tuple
    or dict), of the model and of its submodules."""
    import torch

    found: list[Any] = []
    seen: set[int] = set()

    def take(v: Any, depth: int = 0) -> None:
        if isinstance(v, torch.Tensor):
            if id(v) not in seen:
                seen.add(id(v))
                found.append(v.detach())
        elif isinstance(v, (list, tuple)) and depth < 2:
            for x in v:
                take(x, depth + 1)
        elif isinstance(v, dict) and depth < 2:
            for x in v.values():
                take(x, depth + 1)

    modules = model.modules() if isinstance(model, torch.nn.Module) else [model]
    for m in modules:
        for v in vars(m).values():
            if isinstance(v, dict) and v and all(isinstance(x, (torch.Tensor, type(None))) for x in v.values()):
                take(v)  # _parameters, _buffers
            else:
                take(v)
    return found


def kernel_lookup(module: Any) -> Callable[[Any], str | None]:
    """The name under which ``module`` holds a launched kernel at its top level (through an autotuner's or
    heuristics' wrapper), or None."""
    names: dict[int, str] = {}
    for name, obj in vars(module).items():
        seen = 0
        while obj is not None and seen < 8:
            names.setdefault(id(obj), name)
            inner = getattr(obj, "fn", None)
            if inner is None or inner is obj:
                break
            obj, seen = inner, seen + 1
    return lambda fn: names.get(id(fn))


def autotuned(module: Any) -> bool:
    """Whether ``module`` holds a kernel behind Triton's autotuner: its forward must run for real once before it is
    recorded without launches, so that the configuration recorded is the one it tunes to."""
    from triton.runtime.autotuner import Autotuner

    return any(isinstance(v, Autotuner) for v in vars(module).values())


def without_launches() -> Any:
    """While active, Triton kernels are not launched (nor compiled): what a forward does around them still runs."""
    return _Tracing(None, lambda fn: None, launch=False)


def record(forward: Callable[..., Any], inputs: Sequence[Any], state: Sequence[Any],
           kernel_of: Callable[[Any], str | None], launch: bool = True) -> tuple[Plan, dict[str, Any], set[str]]:
    """One call of ``forward`` on ``inputs``, recorded: the plan, the bytes of its state and constant storages, and
    the aten ops that computed (which a plan cannot carry). Without ``launch`` the kernels are recorded but neither
    compiled nor run: the plan is all that is wanted of them, and the trusted side compiles and runs them itself."""
    import torch

    rec = _Recorder(inputs, state)
    with torch.no_grad(), _Tracing(rec, kernel_of, launch):
        out = forward(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise PlanError("the forward returns something other than tensors")
    plan = Plan(storages=rec.storages, steps=rec.steps, outputs=[rec.view(o) for o in outs])
    plan.validate(len(inputs))
    return plan, rec.payload, rec.compute


# -- execution, on the trusted side -------------------------------------------------------------------------------


class PlanRunner:
    """Executes a plan: ``runner(*inputs)`` returns the outputs as a list of tensors.

    ``kernels`` is the module built from the candidate's source by ``kernel_source.kernels_module``; ``payload``
    holds the bytes of the plan's state and constant storages. Allocations are made fresh at every call through
    torch's allocator, whose freed blocks the judge poisons before every call (``alloc_specs``)."""

    def __init__(self, plan: Plan, kernels: Any, payload: dict[str, Any], device: str, n_inputs: int) -> None:
        import torch

        plan.validate(n_inputs)
        self.plan, self.device = plan, device
        self.kernels: dict[str, Any] = {}
        for name in plan.kernel_names():
            fn = getattr(kernels, name, None)
            if fn is None or not hasattr(fn, "run"):
                raise PlanError(f"the plan launches {name}, which is no kernel of the candidate's source")
            self.kernels[name] = fn
        self.counts: dict[str, int] = dict.fromkeys(self.kernels, 0)  # launches made, per kernel
        self.fixed: dict[int, Any] = {}
        # A constant's bytes as recorded, written back before every call: a kernel that writes into a constant
        # would otherwise carry state from call to call (a count of its calls, say), and a plan run a few times
        # by the judge would behave otherwise when a server runs it thousands of times. The recorded bytes stay in
        # the host's memory, which no kernel on a GPU reaches: a copy on the device would sit in the next block,
        # where a kernel writing past its constant could keep its count instead.
        self._constants: list[tuple[Any, Any]] = []
        for sid, s in enumerate(plan.storages):
            if s["kind"] in ("state", "const"):
                data = payload.get(f"s{sid}")
                if data is None or data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != s["nbytes"]:
                    raise PlanError(f"the plan's storage {sid} comes without its {s['nbytes']} bytes")
                # A fresh allocation: a tensor read from a file may sit at any byte, and Triton takes pointers as
                # 16-byte aligned where the recording's were.
                held = torch.empty(s["nbytes"], dtype=torch.uint8, device=device).copy_(data)
                self.fixed[sid] = held.untyped_storage()
                if s["kind"] == "const":
                    self._constants.append((held, data.to("cpu", copy=True)))

    def alloc_specs(self) -> list[dict[str, Any]]:
        """The allocations of one call, as the judge's poisoning describes blocks."""
        return [{"shape": [n], "dtype": "uint8"} for n in self.plan.alloc_bytes()]

    def __call__(self, *inputs: Any) -> list[Any]:
        import torch

        for held, recorded in self._constants:
            held.copy_(recorded)
        stores: list[Any] = []
        for sid, s in enumerate(self.plan.storages):
            kind = s["kind"]
            if kind == "input":
                x = inputs[s["index"]]
                if not isinstance(x, torch.Tensor) or x.untyped_storage().nbytes() < s["nbytes"]:
                    raise PlanError(f"input {s['index']} is not the tensor the plan was recorded with")
                stores.append(x.untyped_storage())
            elif kind == "alloc":
                stores.append(torch.empty(s["nbytes"], dtype=torch.uint8, device=self.device).untyped_storage())
            else:
                stores.append(self.fixed[sid])

        def view(v: dict[str, Any]) -> Any:
            return torch.empty(0, dtype=getattr(torch, v["dtype"]), device=self.device).set_(
                stores[v["storage"]], v["offset"], v["shape"], v["stride"])

        def launch(name: str, grid: tuple[int, ...], args: dict[str, Any]) -> None:
            self.kernels[name][grid](**args)
            self.counts[name] += 1

        run_steps(self.plan, view, launch, self.device)
        return [view(o) for o in self.plan.outputs]


def run_steps(plan: Plan, view: Callable[[dict[str, Any]], Any],
              launch: Callable[[str, tuple[int, ...], dict[str, Any]], None], device: Any) -> None:
    """The plan's steps in order, over the views ``view`` makes of its storages; each kernel launch through
    ``launch(name, grid, args)``."""
    import torch

    for step in plan.steps:
        op = step["op"]
        if op == "launch":
            launch(step["kernel"], tuple(step["grid"]), {k: _launch_arg(a, view) for k, a in step["args"].items()})
        elif op == "fill":
            view(step["dst"]).fill_(_value(step["value"]))
        elif op == "copy":
            view(step["dst"]).copy_(view(step["src"]))
        elif op == "arange":
            dst = view(step["dst"])
            n = dst.numel()
            start, stp = step["start"], step["step"]
            dst.copy_(torch.arange(n, device=device, dtype=torch.float64).mul_(stp).add_(start)
                      if isinstance(start, float) or isinstance(stp, float) else
                      torch.arange(n, device=device, dtype=torch.int64).mul_(stp).add_(start))


def _launch_arg(a: dict[str, Any], view: Callable[[dict[str, Any]], Any]) -> Any:
    (kind, val), = a.items()
    if kind == "t":
        return view(val)
    if kind == "v":
        return _value(val)
    if kind == "dtype":
        return _tl_dtype(val)
    if kind == "tuple":
        return tuple(_launch_arg(x, view) for x in val)
    from triton.tools.tensor_descriptor import TensorDescriptor

    kwargs: dict[str, Any] = {}
    if val.get("padding") in ("zero", "nan"):
        kwargs["padding"] = val["padding"]
    return TensorDescriptor(view(val["base"]), val["shape"], val["strides"], val["block_shape"], **kwargs)
