"""Racing a proven kernel against the stack's own path for its op before it serves: a kernel that computes the right
thing can still be slower (per-call Python and launch overhead weigh heavily on small ops), so with racing on the
first use of a kernel times it against the stack's own path (``own``: what the stack would have run, not the
traceable ``reference``) on the device, at the kernel's signature, and the kernel serves only where it is faster by
the margin; otherwise every call at that signature runs the stack's own path, counted as ``R_SLOWER``."""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ks_core.settings import Settings

from .serving import ENV_SERVE_MARGIN

log = logging.getLogger("kernelsmith.integrations")


class OnCopies:
    """A stack path that writes into some of its inputs (a fused residual add done in place), callable as an
    ``own`` path, which must leave its inputs as they were: ``fn`` runs on copies of the inputs at ``positions``. A
    race gives our kernel the same copies, so both sides pay the same copying (which only ever favours the
    stack's path under the margin)."""

    def __init__(self, fn: Callable[..., Any], positions: Sequence[int]) -> None:
        self.fn = fn
        self.positions = tuple(positions)

    def __call__(self, *args: Any) -> Any:
        args_ = list(args)
        for i in self.positions:
            args_[i] = args_[i].clone()
        return self.fn(*args_)


# Set while this thread times a stack's own path. Some own paths dispatch back through the layer's replaced forward
# (vLLM's and SGLang's RMSNorm.forward_cuda call self.forward_native): such a call runs the stack's own code,
# uncounted, instead of proving the kernel being raced again.
_RACING = threading.local()


def racing() -> bool:
    """Whether this thread is timing a stack's own path in a race."""
    return getattr(_RACING, "on", False)


@contextlib.contextmanager
def racing_now() -> Iterator[None]:
    """Mark this thread as timing a stack's own path, for the duration."""
    _RACING.on = True
    try:
        yield
    finally:
        _RACING.on = False


def racing_on(device_type: str) -> bool:
    """``KERNELSMITH_SERVE_RACE``: ``auto`` races on a GPU only, since under the Triton interpreter (CPU tensors)
    a kernel's time says nothing about the kernel."""
    mode = Settings.read("serve_race")
    return device_type != "cpu" if mode == "auto" else mode == "1"


def serve_margin() -> float:
    """``KERNELSMITH_SERVE_MARGIN``; a value that is not a number is the default, with a warning (a pack never
    stops a model from loading)."""
    try:
        return float(Settings.read("serve_margin"))
    except ValueError:
        default = Settings().serve_margin
        log.warning("kernelsmith: %s=%r is not a number; racing with a margin of %g", ENV_SERVE_MARGIN,
                    os.environ.get(ENV_SERVE_MARGIN), default)
        return default


def wins(ours_us: float, theirs_us: float, margin: float) -> bool:
    """Whether our kernel serves: its median time times ``margin`` is no more than the stack's own."""
    return ours_us * margin <= theirs_us


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _time_batch(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], n: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    sync()
    return (time.perf_counter() - start) / n


def race(ours: Callable[..., Any], theirs: Callable[..., Any], inputs: Sequence[torch.Tensor],
         device: torch.device, *, rounds: int = 5, calls: int = 20, budget_s: float = 0.05) -> tuple[float, float]:
    """Median µs per call of ``ours(*inputs)`` and ``theirs(*inputs)`` on ``device``.

    Both warm up first (a stack's Triton kernel compiles on its first call). Then interleaved rounds, the order
    alternating so that neither side always follows the other, each side a batch of calls with the device
    synchronized around it; caches stay warm between calls, as in serving. A batch holds fewer calls (down to one)
    where calls are slow, so that a race takes about ``budget_s``."""
    from ks_inductor.judge import device_lock

    sync = _synchronizer(device)
    sides = (ours, theirs)
    # On a GPU the race holds the device alone against every kernelsmith process (a judge's timing, a warm), as
    # the judge does to time.
    alone = device_lock.exclusive(device.index) if device.type == "cuda" else contextlib.nullcontext()
    with alone, torch.no_grad():
        for fn in sides:
            _time_batch(fn, inputs, 2, sync)
        once = sum(_time_batch(fn, inputs, 1, sync) for fn in sides)
        n = max(1, min(calls, int(budget_s / max(rounds * once, 1e-9))))
        times: tuple[list[float], list[float]] = ([], [])
        for r in range(rounds):
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[side].append(_time_batch(sides[side], inputs, n, sync))
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6
