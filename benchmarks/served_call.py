"""What a served call costs on the host beyond its kernel: ``ServedOp.__call__`` (the kill switch, the signature
key, the route, the hit counter) around a kernel that returns its first input, against calling that kernel bare.

In a decode step every served call pays this path, about forty times a step for a Llama-style model. Run on the CPU
(the default) or on a GPU with ``--device cuda``; ``--json`` prints the result on stdout.

    python -m benchmarks.served_call [--device cuda] [--calls 100000] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from integrations.served_op import ServedOp
from integrations.signature import call_signature


class _Source:
    """A ``KernelSource`` (``integrations.served_op``) holding one kernel that has passed every check."""

    race = False
    epoch = 0
    kernels: dict[str, list[Any]] = {}

    def __init__(self, device_type: str, kernel: Any) -> None:
        self.stack = "benchmark"
        self.device_type = device_type
        self.kernel = kernel

    def ready_kernel(self, key: str, device: torch.device, reference: Any = None, own: Any = None) -> Any:
        return self.kernel

    def race_kernel(self, k: Any, key: str, device: torch.device, own: Any, at: Any = None) -> str:
        return ""

    def changed(self) -> None:
        pass

    def hit_counter(self, op: str) -> Callable[[], object]:
        return itertools.count().__next__

    def count_fallback(self, op: str, reason: str) -> None:
        raise RuntimeError(f"the benchmark's call fell back: {reason}")


def served_op(args: tuple[torch.Tensor, ...]) -> ServedOp:
    """An op that serves ``args``' signature with a kernel returning its first input."""
    kernel = SimpleNamespace(plan=None, judged_call=lambda *a: a[0], state="passed",
                             problem=SimpleNamespace(output_specs=[]))
    sig = call_signature(args)
    op = ServedOp(_Source(args[0].device.type, kernel), "op", {sig: "key"})
    with torch.no_grad():
        op._outputs_fit = lambda route, outs: True  # the kernel's outputs are its input's: nothing to check
        if op(*args) is not args[0]:
            raise RuntimeError("the op did not serve its own signature")
    return op


def _per_call_us(fn: Callable[[], Any], calls: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def measure(device: str = "cpu", calls: int = 100_000) -> dict[str, Any]:
    """µs a call, the median of 5 rounds: through the served op and bare, with 2 and 4 inputs (an RMSNorm's and a
    rotary embedding's arity)."""
    out: dict[str, Any] = {"device": device, "torch": torch.__version__, "calls": calls}
    for n in (2, 4):
        args = tuple(torch.randn(16, 1, 2048, device=device) for _ in range(n))
        op = served_op(args)
        bare = op.guard.kernel.judged_call
        with torch.no_grad():
            out[f"served_{n}_inputs_us"] = round(_per_call_us(lambda op=op, a=args: op(*a), calls), 3)
            out[f"bare_{n}_inputs_us"] = round(_per_call_us(lambda f=bare, a=args: f(*a), calls), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    args = p.parse_args(argv)
    result = measure(args.device, args.calls)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:22} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
