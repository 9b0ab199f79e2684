"""Which jobs may share a device.

Jobs on one GPU normally overlap: several workers compile and check while one times (the device lock). Each worker
may take most of the device's memory (``JudgeConfig.device_memory_fraction``), which is what a single KernelBench
problem with 16 GiB inputs needs: its inputs, their saved copies, the rotating timing sets and the reference's
outputs. Two such jobs at once run the device out of memory, and the verdict would blame whichever candidate asked
last. So a job whose working set is a large share of the device runs alone: it waits for the jobs in flight to end,
and none start until it has.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod
from typing import Any

# A job holds its inputs several times over (a trial's inputs and their saved copies, the timing sets) and each output
# at least twice (the candidate's and the reference's): a working set of about this many times inputs plus outputs.
HOLD_FACTOR = 3
ALONE_SHARE = 0.25  # of the device's memory: a working set above it runs alone


def input_bytes(specs: Iterable[Any]) -> int:
    """Bytes of a problem's tensor inputs, from its input specs (``Problem.input_specs``)."""
    import torch

    return sum(prod(s.shape) * getattr(torch, s.dtype).itemsize for s in specs
               if s.kind == "tensor" and s.shape is not None)


def output_bytes(specs: Iterable[Any]) -> int:
    """Bytes of a problem's tensor outputs, from its traced output specs (``Problem.output_specs``)."""
    return input_bytes(specs)


def runs_alone(in_bytes: int, out_bytes: int, device_bytes: int, hold: float = HOLD_FACTOR) -> bool:
    """True when a job of these sizes should not share its device with other jobs. ``hold``: how many times over the
    job holds its inputs and outputs (the baselines' job holds every timing set at once, and Inductor's buffers)."""
    if device_bytes <= 0:
        return False
    return hold * (in_bytes + out_bytes) > ALONE_SHARE * device_bytes
