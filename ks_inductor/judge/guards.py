"""Runtime guards installed in a worker before candidate code is imported.

They answer what static rules cannot: did Triton kernels really launch; did torch compute anything during the
candidate's forward, however it was reached; did the candidate patch timers or torch, start threads, switch
streams, or flip global numerics flags.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

# aten ops that allocate, view or move memory. Anything else executed during the candidate's forward is torch
# computing part of the answer, and is rejected.
ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_", "arange", "scalar_tensor",
    "view", "_unsafe_view", "reshape", "as_strided", "expand", "permute", "t", "transpose", "unsqueeze", "squeeze",
    "slice", "select", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "narrow", "flatten",
    "unflatten", "view_as", "expand_as", "contiguous", "clone", "copy_", "_to_copy", "to", "lift_fresh",
    "lift_fresh_copy", "_local_scalar_dense", "is_same_size", "resize_", "set_", "_reshape_alias", "stride",
    "size", "sym_size", "sym_stride", "sym_numel", "numel", "dim", "is_contiguous", "item", "_has_compatible_shallow_copy_type",
    "record_stream", "empty_permuted",
})


class LaunchCounter:
    """Counts Triton launches by patching the launch entry points at class level (JIT and interpreter)."""

    def __init__(self, device: str = "cpu") -> None:
        self.counts: Counter[str] = Counter()
        self.enabled = True
        self.device = device
        self.expected_stream: int | None = None
        self.off_stream = 0
        self._originals: list[tuple[Any, Any]] = []  # (class, its launch entry point) while installed

    def install(self) -> None:
        from triton.runtime.jit import JITFunction

        targets = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            targets.append(InterpretedFunction)
        except ImportError:
            pass
        counter = self
        self._originals = [(cls, cls.run) for cls in targets]
        for cls in targets:
            original = cls.run

            def run(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if counter.enabled and not kwargs.get("warmup", False):
                    fn = getattr(self, "fn", None)
                    name = getattr(fn, "__name__", None) or getattr(self, "__name__", "kernel")
                    counter.counts[name] += 1
                    counter._check_stream()
                return _original(self, *args, **kwargs)

            cls.run = run

    def uninstall(self) -> None:
        """Put the launch entry points back, so that a worker that takes another job counts it afresh."""
        for cls, original in reversed(self._originals):
            cls.run = original
        self._originals = []

    def _check_stream(self) -> None:
        # Triton launches on torch's current stream; anything else is work the timing events cannot see.
        if self.device == "cpu":
            return
        import torch

        current = torch.cuda.current_stream().cuda_stream
        if self.expected_stream is None:
            self.expected_stream = torch.cuda.default_stream().cuda_stream
        if current != self.expected_stream:
            self.off_stream += 1

    def total(self) -> int:
        return sum(self.counts.values())


class TorchOpRecorder:
    """Records every aten op dispatched while active (a TorchDispatchMode sees ops however they were reached:
    functional calls, tensor methods, operators, nn.Module calls)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.ops: Counter[str] = Counter()

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
                recorder.ops[name] += 1
                return func(*args, **(kwargs or {}))

        self._mode_cls = _Mode

    def __enter__(self) -> TorchOpRecorder:
        self._mode = self._mode_cls()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def compute_ops(self) -> list[str]:
        return compute_ops(self.ops)


def compute_ops(names: Any) -> list[str]:
    """The aten ops among ``names`` that compute (not in ``ALLOWED_ATEN``). The judge applies it in its own process
    to the names a candidate's worker reports, so rebinding the allow-list inside that worker changes nothing."""
    return sorted({op for op in names if op.rstrip("_") not in ALLOWED_ATEN and op not in ALLOWED_ATEN})


def identity_snapshot() -> dict[str, int]:
    """ids of the functions a timing or comparison depends on; a change after candidate import is tampering."""
    import math
    import time

    import torch

    items: dict[str, Any] = {
        "time.perf_counter": time.perf_counter,
        "time.time": time.time,
        "torch.allclose": torch.allclose,
        "torch.equal": torch.equal,
        "torch.Tensor.__eq__": torch.Tensor.__eq__,
        "torch.Tensor.clone": torch.Tensor.clone,
        "torch.Tensor.copy_": torch.Tensor.copy_,
        "torch.Tensor.to": torch.Tensor.to,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.compile": torch.compile,
        "torch.nn.Module.__call__": torch.nn.Module.__call__,
        "math.isclose": math.isclose,
    }
    try:
        from safetensors import torch as st

        items["safetensors.torch.save_file"] = st.save_file
    except ImportError:
        pass
    return {k: id(v) for k, v in items.items()}


def numerics_flags() -> dict[str, Any]:
    import torch

    return {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
    }


# Where the interpreter starts an OS thread: the low-level module's entry points, and the references ``threading``
# keeps to them. A thread started through any of these but not through ``threading.Thread.start`` runs code outside
# every thread-local guard (the op recorder's dispatch mode is per thread).
_RAW_STARTS = (("_thread", "start_new_thread"), ("_thread", "start_joinable_thread"), ("_thread", "start_new"),
               ("threading", "_start_new_thread"), ("threading", "_start_joinable_thread"))


class ThreadWatch:
    """Records every thread started after install, with the module its code comes from. Framework threads
    (Triton's and Inductor's compile pools, CUDA's) are expected; threads whose code is the candidate's are not,
    nor is any thread started through ``_thread`` directly rather than through ``threading.Thread``."""

    def __init__(self, candidate_prefix: str) -> None:
        self.prefix = candidate_prefix
        self.started: list[str] = []
        self.raw = 0  # threads started through _thread's entry points, not through threading.Thread.start
        self._original: Any = None  # Thread.start while installed
        self._raw_originals: list[tuple[Any, str, Any]] = []
        self._in_start = threading.local()

    def install(self) -> None:
        import importlib

        watch = self
        original = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            target = getattr(thread, "_target", None)
            mods = {type(thread).__module__, getattr(target, "__module__", None) or ""}
            watch.started.extend(m for m in mods if m)
            watch._in_start.on = True
            try:
                return original(thread)
            finally:
                watch._in_start.on = False

        self._original = original
        threading.Thread.start = start  # type: ignore[method-assign]
        for mod_name, attr in _RAW_STARTS:
            mod = importlib.import_module(mod_name)
            fn = getattr(mod, attr, None)
            if fn is None:
                continue

            def raw(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
                if not getattr(watch._in_start, "on", False):
                    watch.raw += 1
                return _fn(*args, **kwargs)

            self._raw_originals.append((mod, attr, fn))
            setattr(mod, attr, raw)

    def uninstall(self) -> None:
        if self._original is not None:
            threading.Thread.start = self._original  # type: ignore[method-assign]
            self._original = None
        for mod, attr, fn in reversed(self._raw_originals):
            setattr(mod, attr, fn)
        self._raw_originals = []

    def candidate_threads(self) -> list[str]:
        return [m for m in self.started if m.startswith(self.prefix)] + ["_thread"] * self.raw


def current_stream_id(device: str) -> int | None:
    if device == "cpu":
        return None
    import torch

    return torch.cuda.current_stream().cuda_stream
