"""The worker side of the judge's protocol, and the small tensor helpers every job uses.

A worker talks to the judge over one file descriptor (JSON lines out: stage changes, requests for the device, each
output handed over for comparison, the result) and reads the judge's answers on stdin. Tensors travel as safetensors
files in the job's own folder, never pickled.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

_events = None  # the protocol channel (a file object over the descriptor the judge passed)


def open_channel(fd: int) -> None:
    global _events
    _events = os.fdopen(fd, "w")


def send(msg: dict[str, Any]) -> None:
    import json

    _events.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
    _events.flush()  # type: ignore[union-attr]


def stage(name: str, label: str | None = None) -> None:
    """Enter stage ``name`` (its time limit applies); ``label`` names the time spent for the judge's clock where it
    differs from the stage (the Inductor baseline's compile runs under the compile limit)."""
    send({"event": "stage", "stage": name, **({"label": label} if label else {})})


def mark(name: str) -> None:
    """Tell the judge's clock where the time goes from here on, within the current stage."""
    send({"event": "mark", "name": name})


def acquire(mode: str) -> None:
    """Ask the judge for the device: "shared" to compile and check, "exclusive" to time."""
    send({"event": "acquire", "mode": mode})
    if sys.stdin.readline().strip() != "grant":
        raise RuntimeError("device lock not granted")


def release(mode: str) -> None:
    send({"event": "release", "mode": mode})


class Stop(Exception):
    """The judge has seen an output it rejects: the job ends here."""


def as_outputs(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)] if all(
            isinstance(o, torch.Tensor) or o is None for o in out) else list(out)
    return [out]


def save(path: str, outs: list[Any]) -> None:
    from safetensors.torch import save_file

    save_file({f"out{i}": o.detach().to("cpu").contiguous() for i, o in enumerate(outs)}, path)


def deliver(workdir: str, kind: str, index: int, outs: list[Any], **extra: Any) -> None:
    """Hand one output to the judge, which compares it with the reference and deletes the file before it answers,
    so at most one of a candidate's outputs is on disk at a time (KernelBench's run to 8.6 GB each)."""
    save(os.path.join(workdir, f"{kind}_{index}.safetensors"), outs)
    send({"event": "output", "kind": kind, "index": index, **extra})
    reply = sys.stdin.readline().strip()
    if reply == "stop":
        raise Stop
    if reply != "next":
        raise RuntimeError(f"the judge did not take output {kind} {index}")


# Host memory the outputs of one run may wait in until the device is released (see Deliveries).
STASH_BYTES = 1 << 30


class Deliveries:
    """Outputs produced while the device is held (shared or alone), handed to the judge once it is released.

    Writing an output and waiting for the judge's comparison is host work; done under the exclusive lock it keeps
    every other judgment off the device for nothing. Each output is copied to host memory as it is produced, up to
    ``limit`` bytes in all; past that an output is handed over at once, as when outputs are too large to keep. What
    waits here is a copy of what the candidate returned: whatever the candidate does to this stash can only change
    the outputs it is judged on, which the judge compares with references this process never holds."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.waiting: list[tuple[str, str, int, list[Any], dict[str, Any]]] = []

    def hand(self, workdir: str, kind: str, index: int, outs: list[Any], **extra: Any) -> None:
        size = sum(o.numel() * o.element_size() for o in outs if hasattr(o, "element_size"))
        if self.used + size > self.limit:
            deliver(workdir, kind, index, outs, **extra)
            return
        self.used += size
        host = [o.detach().to("cpu", copy=True) if hasattr(o, "detach") else o for o in outs]
        self.waiting.append((workdir, kind, index, host, extra))

    def flush(self) -> None:
        while self.waiting:
            workdir, kind, index, outs, extra = self.waiting.pop(0)
            deliver(workdir, kind, index, outs, **extra)


def sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


_POISON_RNG = random.Random(int.from_bytes(os.urandom(8), "little"))
# The share of calls whose poison is NaN; the others get a finite value drawn per call.
POISON_NAN_SHARE = 0.25


def poison_value(floating: bool) -> float | int:
    """One call's poison: NaN now and then, else a large finite value of random sign and magnitude (integers: a
    random integer). Drawn per call, checked or timed alike, so the contents of an output block before a call tell a
    kernel nothing: one that works only when its output reads NaN, which every poisoned block would, skips its work
    on most checked calls and is rejected."""
    if not floating:
        return _POISON_RNG.choice((-1, 1)) * _POISON_RNG.randint(3, 100)  # within int8
    if _POISON_RNG.random() < POISON_NAN_SHARE:
        return float("nan")
    # Up to 3e4: finite in float16 too.
    return _POISON_RNG.choice((-1.0, 1.0)) * 10 ** _POISON_RNG.uniform(2.0, 4.5)


def poison(outs_like: list[dict[str, Any]], device: str, wait: bool = True) -> None:
    """Fill freed allocator blocks of the outputs' sizes with this call's poison (:func:`poison_value`), so a kernel
    that leaves part of its output unwritten returns garbage instead of whatever an earlier call left there. Without
    ``wait`` the fills stay queued: the next allocation of those blocks on the same stream comes after them anyway."""
    import torch

    junk = []
    value = {True: poison_value(True), False: poison_value(False)}
    for spec in outs_like:
        t = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device=device)
        if t.dtype == torch.bool:
            t.fill_(bool(_POISON_RNG.getrandbits(1)))
        elif not t.is_floating_point() and not t.is_signed():
            t.fill_(abs(value[False]) % 250 + 3)  # unsigned: a value the type holds
        else:
            t.fill_(value[t.is_floating_point()])
        junk.append(t)
    if wait:
        sync(device)
    del junk


def bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    if not isinstance(a, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))
