"""Which jobs may share a device, by the device memory each will hold.

Jobs on one GPU normally overlap: several workers compile and check while one times (the device lock). A job of a
GB-scale problem holds its inputs several times over (a trial's inputs and their saved copies, every timing set, the
active copy the timed calls read, fresh contents for the next call) and its outputs as often: a KernelBench 3-D max
pool (4.3 GB of input) held 17 to 33 GiB in each of its workers, and four of them with the reference's and the
baselines' jobs ran an H200 out of memory. An out-of-memory error blames whichever candidate asked last. So each job
says what it will hold (:func:`job_bytes`), and a :class:`MemoryGate` per device starts jobs, first come first
served, while their sum fits in the device's memory; a job larger than the device runs alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from math import prod
from typing import Any

# The share of a device's memory the judge's jobs may hold together: the rest is for the judge's own process and
# whatever else shares the device.
GATE_SHARE = 0.85
# What a worker holds besides its tensors: the CUDA context, torch's and Triton's own buffers (about 0.5 GiB each on
# an H200), with room for the allocator's rounding.
CONTEXT_BYTES = 1 << 30
# A job's need that no device fits: it runs alone.
ALONE = 1 << 62

# Per job kind: how many times over it holds its inputs and its outputs, as (inputs, outputs) with ``sets`` the
# number of timing sets.
#   record:    inputs drawn for two recordings and the capture check; outputs allocated for each.
#   plan:      trial inputs and their saved copies, every timing set, the active copy, one set of fresh contents;
#              outputs of the trials, of the checked timed calls and of the CUDA-graph replays (one per set).
#   reference: a trial's inputs, a repeat, the float64 rerun's; its outputs as often.
#   baselines: every timing set, the active copy, both tools' outputs and Inductor's buffers.
_HOLDS = {
    "record": lambda sets: (3, 3),
    "plan": lambda sets: (sets + 4, sets + 3),
    "reference": lambda sets: (3, 3),
    "baselines": lambda sets: (sets + 3, sets + 3),
}


def input_bytes(specs: Iterable[Any]) -> int:
    """Bytes of a problem's tensor inputs, from its input specs (``Problem.input_specs``)."""
    import torch

    return sum(prod(s.shape) * getattr(torch, s.dtype).itemsize for s in specs
               if s.kind == "tensor" and s.shape is not None)


def output_bytes(specs: Iterable[Any]) -> int:
    """Bytes of a problem's tensor outputs, from its traced output specs (``Problem.output_specs``)."""
    return input_bytes(specs)


def job_bytes(kind: str, in_bytes: int, out_bytes: int | None, sets: int) -> int:
    """Device memory a job of ``kind`` holds at most: its inputs and outputs as many times over as it keeps them
    (``_HOLDS``), and a worker's own. ``out_bytes`` unknown (the reference not yet run): taken as large as the
    inputs."""
    ins, outs = _HOLDS[kind](sets)
    out = in_bytes if out_bytes is None else out_bytes
    return CONTEXT_BYTES + ins * in_bytes + outs * out


class MemoryGate:
    """Admits a device's jobs by the memory each will hold: a job starts when it is the first waiting and its bytes
    fit beside those of the jobs running, or when none runs (a job larger than the device then runs alone). First
    come first served, so a large job is not starved by a stream of small ones. ``capacity`` 0: sizes unknown, every
    job starts at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self.used = 0
        self.running = 0
        self._queue: deque[int] = deque()
        self._tickets = 0
        self._cond = threading.Condition()

    def acquire(self, need: int) -> int:
        """Wait until a job of ``need`` bytes may start; returns the bytes to :meth:`release` when it ends."""
        with self._cond:
            take = max(1, min(int(need), self.capacity)) if self.capacity else 0
            ticket = self._tickets
            self._tickets += 1
            self._queue.append(ticket)
            while self._queue[0] != ticket or (self.running and self.used + take > self.capacity):
                self._cond.wait()
            self._queue.popleft()
            self.used += take
            self.running += 1
            self._cond.notify_all()
            return take

    def release(self, taken: int) -> None:
        with self._cond:
            self.used -= taken
            self.running -= 1
            self._cond.notify_all()
