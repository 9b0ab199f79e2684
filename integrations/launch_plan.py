"""Served kernels replayed without Triton's per-call dispatch.

In an eagerly run model (transformers' decode step), a served kernel's cost is mostly the host's: the kernel
module's Python forward, Triton's binder, cache key and launch metadata take tens of microseconds around a launch
of a few. A kernel's forward, by the judge's rules, only views its inputs, allocates outputs and launches Triton
kernels, with a control flow that depends on the inputs' signature alone. So at one signature, its launches are
fixed: the same compiled kernels, grids and scalar arguments, pointers into the inputs at fixed offsets or into
fresh allocations. A ``LaunchPlan`` records them from two calls of the forward and replays them: the allocations,
then each compiled kernel, launched from C++ by torch's static launcher where it takes the kernel
(:mod:`integrations.static_launch`), else by Triton's own launcher.

A plan is made only where that holds, and checked before it serves:

* both recorded calls launch the same kernels with the same grids, scalars and pointer layout (an autotuner
  still trying configurations, or a forward that depends on anything else, differs between them);
* every pointer is into an input at a fixed byte offset, or into a buffer the forward allocated; every output is
  one such buffer whole (or an input returned as it is);
* the replay's outputs equal the forward's on the same inputs, bit for bit;
* at each replay, every pointer Triton specialized as 16-byte aligned still is (else the call takes the forward).

Where any of this fails, or no launch hook may be skipped (a profiler set Triton's launch hooks), the kernel keeps
its forward. Only compiled kernels on a GPU are planned: the interpreter has no launcher to call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("kernelsmith.integrations")

_RECORD_LOCK = threading.Lock()
_local = threading.local()


@dataclass(frozen=True)
class _Arg:
    """One launch argument: ``("input", i, byte offset)``, ``("buffer", j, byte offset)`` or ``("value", v)``,
    with whether Triton specialized it as 16-byte aligned (a pointer)."""

    kind: str
    index: int = 0
    offset: int = 0
    value: Any = None
    aligned: bool = False


@dataclass(frozen=True)
class _Launch:
    kernel: Any  # triton CompiledKernel
    grid: tuple[int, int, int]
    args: tuple[_Arg, ...]


@dataclass(frozen=True)
class _Buffer:
    """Memory the forward allocated: ``nbytes`` of scratch, or, for an output, its layout."""

    nbytes: int
    layout: tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None = None


def _recording_run(original: Any) -> Any:
    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        calls = getattr(_local, "calls", None)
        if calls is not None and not warmup:
            calls.append((self, kernel, args, kwargs, grid))
        return kernel

    return run


@contextlib.contextmanager
def _recording() -> Any:
    """Every ``JITFunction.run`` this thread makes in the block, with what it launched."""
    from triton.runtime.jit import JITFunction

    with _RECORD_LOCK:
        original = JITFunction.run
        JITFunction.run = _recording_run(original)
        _local.calls = []
        try:
            yield _local.calls
        finally:
            JITFunction.run = original
            _local.calls = None


def _hooks_set() -> bool:
    """Whether anything (a profiler) hooks Triton's launches: a plan launches without them."""
    try:
        from triton import knobs

        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):
        return True  # a Triton whose hooks cannot be read: never skip them
    # Triton keeps its hooks in chains that are there, empty, when nothing hooks in.
    return any(h is not None and (not hasattr(h, "calls") or len(h.calls) > 0) for h in hooks)


class _NotPlannable(Exception):
    pass


# The aten ops a planned forward may dispatch: allocation and views, which write no memory. A copy (``contiguous()``
# of a strided input), a fill (``zeros``) or any other op writes memory a kernel may then read; the replay would skip
# it, so such a forward is not planned.
_DATA_FREE = frozenset({
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view", "_unsafe_view", "as_strided",
    "permute", "transpose", "t", "unsqueeze", "squeeze", "expand", "slice", "select", "detach", "alias", "split",
    "split_with_sizes", "unbind", "narrow", "view_as", "unflatten", "lift_fresh", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "dim", "size", "stride", "numel",
    # A tensor rebound to a storage (how a judged plan makes its views, ``judge.plan.PlanRunner``): no data moves.
    "set_",
})


def _bound(fn: Any, args: tuple, kwargs: dict, device: int) -> tuple[list[Any], list[Any]]:
    """The arguments Triton hands the launcher, and its specialization of each."""
    caches = fn.device_caches[device]
    binder = caches[-1]
    bound, specialization, _ = binder(*args, **kwargs)
    return list(bound.values()), list(specialization)


def _grid(grid: Any, fn: Any, args: tuple, kwargs: dict, device: int) -> tuple[int, int, int]:
    if callable(grid):
        caches = fn.device_caches[device]
        bound, _, _ = caches[-1](*args, **kwargs)
        grid = grid(bound)
    g = tuple(int(x) for x in grid)
    return (g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)


def _storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole of the memory ``t`` lies in, as bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _classify(t: torch.Tensor, inputs: Sequence[torch.Tensor], buffers: list[torch.Tensor]) -> tuple[str, int, int]:
    """Where a launch's tensor points: into input ``i`` (at a byte offset from that input's own pointer), or into
    allocation ``j`` (at a byte offset from its start)."""
    ptr = t.data_ptr()
    for i, x in enumerate(inputs):
        st = x.untyped_storage()
        if st.data_ptr() <= ptr < st.data_ptr() + max(st.nbytes(), 1):
            return "input", i, ptr - x.data_ptr()
    for j, b in enumerate(buffers):
        if b.data_ptr() <= ptr < b.data_ptr() + max(b.numel(), 1):
            return "buffer", j, ptr - b.data_ptr()
    buffers.append(_storage_of(t))
    return "buffer", len(buffers) - 1, ptr - buffers[-1].data_ptr()


def _describe(calls: list, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
              device: int) -> tuple[list[_Launch], list[_Buffer], list[tuple[str, int]]]:
    storages: list[torch.Tensor] = []
    launches = []
    for fn, kernel, args, kwargs, grid in calls:
        if kernel is None or not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            raise _NotPlannable("a launch without a compiled kernel")
        values, spec = _bound(fn, args, kwargs, device)
        described = []
        for v, sp in zip(values, spec):
            if isinstance(v, torch.Tensor):
                kind, idx, off = _classify(v, inputs, storages)
                aligned = isinstance(sp, tuple) and len(sp) > 1 and sp[1] == "D"
                described.append(_Arg(kind, idx, off, aligned=aligned))
            elif v is None or isinstance(v, (bool, int, float)):
                described.append(_Arg("value", value=v))
            else:
                raise _NotPlannable(f"a launch argument of type {type(v).__name__}")
        launches.append(_Launch(kernel, _grid(grid, fn, args, kwargs, device), tuple(described)))
    layouts: dict[int, tuple] = {}
    placed = []
    for out in outputs:
        if any(out is x for x in inputs):
            placed.append(("input", next(i for i, x in enumerate(inputs) if out is x)))
            continue
        kind, idx, off = _classify(out, inputs, storages)
        if kind != "buffer" or off != 0 or idx in layouts or out.storage_offset() != 0 \
                or not out.is_contiguous() or out.numel() * out.element_size() != storages[idx].numel():
            raise _NotPlannable("an output that is not an allocation of its own")
        layouts[idx] = (tuple(out.shape), tuple(out.stride()), out.dtype)
        placed.append(("buffer", idx))
    return launches, [_Buffer(b.numel(), layouts.get(j)) for j, b in enumerate(storages)], placed


def _same(a: tuple, b: tuple) -> bool:
    la, ba, pa = a
    lb, bb, pb = b
    if pa != pb or ba != bb or len(la) != len(lb):
        return False
    return all(x.kernel is y.kernel and x.grid == y.grid and x.args == y.args for x, y in zip(la, lb))


class LaunchPlan:
    """The launches of a kernel's forward at one signature, replayed with new inputs: ``plan(*inputs)`` returns
    the outputs (a tensor, or a tuple), or None where this call must take the forward (a pointer Triton assumed
    aligned is not)."""

    def __init__(self, launches: list[_Launch], buffers: list[_Buffer], outputs: list[tuple[str, int]],
                 device: torch.device, single: bool, static: bool = False) -> None:
        self.device = device
        self.single = single
        from triton.runtime.driver import driver

        self._stream = driver.active.get_current_stream
        self._index = device.index
        # What a replay does, resolved once (a decode step pays every attribute lookup here on the host): each
        # buffer's allocation, and per launch the launcher with its fixed arguments, the scalar values in place
        # and, for each pointer, (position, from an input, index, byte offset).
        self._allocations = [((b.layout[0], b.layout[2]) if b.layout is not None else ((b.nbytes,), torch.uint8))
                             for b in buffers]
        self._replays = []
        # Why each launch keeps Triton's launcher where torch's static one was asked for ("" where it launches).
        self.static_notes: list[str] = []
        aligned: set[tuple[int, int]] = set()
        for launch in launches:
            k = launch.kernel
            loaded, note = _static_kernel(k, self._index) if static else (None, "not asked for")
            if loaded is not None and loaded.params != len(launch.args):
                loaded, note = None, "its launch arguments are not its parameters"
            self.static_notes.append(note)
            # Triton's launcher takes every parameter (constexprs too, which it skips); the static one only the
            # runtime arguments.
            args = [launch.args[i] for i in loaded.keep] if loaded is not None else launch.args
            values = [a.value if a.kind == "value" else 0 for a in args]
            pointers = tuple((pos, a.kind == "input", a.index, a.offset)
                             for pos, a in enumerate(args) if a.kind != "value")
            self._replays.append((loaded, k.run, launch.grid, k.function, k.packed_metadata, values, pointers))
            # A buffer is a fresh allocation, aligned far beyond 16 bytes; only pointers into inputs can lose it.
            aligned.update((a.index, a.offset) for a in launch.args if a.kind == "input" and a.aligned)
        # Checked before anything launches, so that a declined call has written nothing (a forward may write into
        # its inputs).
        self._aligned = tuple(sorted(aligned))
        self._outputs = tuple((kind == "input", i) for kind, i in outputs)

    def launcher(self) -> str:
        """How the plan launches, for a guard's statistics: ``static`` where every launch goes through torch's
        static launcher, else ``triton`` with why the first that does not keeps Triton's."""
        notes = [n for n in self.static_notes if n]
        return "static" if not notes else f"triton ({notes[0]})"

    def __call__(self, *inputs: torch.Tensor) -> Any:
        ptrs = [x.data_ptr() for x in inputs]
        for i, offset in self._aligned:
            if (ptrs[i] + offset) & 15:
                return None
        device = self.device
        bufs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self._allocations]
        bptrs = [b.data_ptr() for b in bufs]
        stream = self._stream(self._index)
        for static, run, g, function, metadata, values, pointers in self._replays:
            vals = values.copy()
            for pos, from_input, i, offset in pointers:
                vals[pos] = (ptrs if from_input else bptrs)[i] + offset
            if static is not None:
                static.launch(static.function, g[0], g[1], g[2], static.num_warps, static.shared, static.arg_types,
                              (*vals, *static.extra), stream)
            else:
                run(g[0], g[1], g[2], stream, function, metadata, None, None, None, *vals)
        outs = [inputs[i] if from_input else bufs[i] for from_input, i in self._outputs]
        return outs[0] if self.single else tuple(outs)


def _like(x: torch.Tensor) -> torch.Tensor:
    """Other values at ``x``'s signature."""
    t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    if x.dtype.is_floating_point:
        return t.normal_()
    return t.copy_(x)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _copy(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x) for x in xs]


def _replays_forward(plan: LaunchPlan, forward: Any, first: list[torch.Tensor], want: list[Any],
                     second: list[torch.Tensor]) -> str:
    """Why ``plan`` is not ``forward`` ("" where it is): its replay against the forward on the recorded values
    (``want``, the forward's outputs on ``first``) and on others of the same signature (memory the plan does not
    write would show as a difference on the second)."""
    try:
        for values, expected in ((first, want), (second, None)):
            with torch.no_grad():
                got = plan(*_copy(values))
                if expected is None:
                    expected = _as_list(forward(*_copy(values)))
            if got is None:
                return "an input is not aligned as Triton assumed"
            for g, w in zip(_as_list(got), expected):
                if g.shape != w.shape or g.dtype != w.dtype or g.stride() != w.stride() or not torch.equal(g, w):
                    return "the replay's outputs differ from the forward's"
    except Exception as e:  # noqa: BLE001 - a replay that fails is not a plan
        return f"the replay failed ({type(e).__name__}: {e})"
    return ""


_STATIC: dict[tuple[Any, int], tuple[Any, str]] = {}
_STATIC_LOCK = threading.Lock()


def _static_kernel(kernel: Any, device_index: int) -> tuple[Any, str]:
    """``kernel`` loaded for torch's static launcher on the device, once per kernel and device."""
    from .static_launch import static_kernel

    with _STATIC_LOCK:
        if (kernel, device_index) not in _STATIC:
            _STATIC[(kernel, device_index)] = static_kernel(kernel, device_index)
        return _STATIC[(kernel, device_index)]


def make_plan(forward: Any, signature_of: Sequence[torch.Tensor]) -> tuple[LaunchPlan | None, str]:
    """Record ``forward`` twice at the signature of ``signature_of`` and check a replay against it: (plan, "")
    or (None, why not). The calls run on inputs of its own making, never on the tensors given (a forward may
    write into its inputs, as a fused residual add does)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None, "the Triton interpreter runs the kernels: there is no launcher to replay"
    if not signature_of or signature_of[0].device.type != "cuda":
        return None, "not on a GPU"
    if _hooks_set():
        return None, "Triton's launch hooks are set"
    device = signature_of[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        from ks_inductor.judge.guards import TorchOpRecorder

        first, second = [_like(x) for x in signature_of], [_like(x) for x in signature_of]
        with torch.no_grad():
            forward(*_copy(first))  # compiles and autotunes, which a recording must not see
        seen = []
        for _ in range(2):
            ins = _copy(first)
            with _recording() as calls, torch.no_grad(), TorchOpRecorder() as ops:
                out = forward(*ins)
            writes = sorted(op for op in ops.ops if op not in _DATA_FREE)
            if writes:
                return None, f"the forward runs torch ops that write memory ({', '.join(writes[:4])})"
            outs = _as_list(out)
            if not calls or not all(isinstance(o, torch.Tensor) for o in outs):
                return None, "the forward launched no Triton kernel or returned something else"
            launches, buffers, placed = _describe(list(calls), ins, outs, index)
            seen.append((launches, buffers, placed, outs))
        if not _same(seen[0][:3], seen[1][:3]):
            return None, "two calls launched differently"
        launches, buffers, placed, want = seen[1]
        single = not isinstance(out, (tuple, list))
        # Through torch's static launcher where it takes the kernels, else (or where that replay is not the
        # forward's) through Triton's own.
        for static in (True, False):
            plan = LaunchPlan(launches, buffers, placed, torch.device("cuda", index), single, static=static)
            why = _replays_forward(plan, forward, first, want, second)
            if not why or not static or all(plan.static_notes):
                break
            log.info("kernelsmith: a plan through torch's static launcher did not replay its forward (%s); "
                     "it launches through Triton's", why)
        return (plan, "") if not why else (None, why)
    except _NotPlannable as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a plan is an optimisation: anything odd keeps the forward
        return None, f"{type(e).__name__}: {e}"
