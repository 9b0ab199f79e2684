"""A problem's plain form, as the cache stores it and packs carry it: its input specs, the Problem record and its
JSON, and its KernelBench source run as a module. Loading, tracing and keying problems is
:mod:`ks_inductor.problem_tracing`'s.

A problem is always carried as *source text* (``class Model``, ``get_inputs()``, ``get_init_inputs()``), so that
it can cross a process boundary without pickle and be re-loaded unchanged by judge workers.
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import asdict, dataclass, field
from typing import Any


class ProblemError(Exception):
    """A problem file or callable that cannot be loaded or traced; the message says what to fix."""


@dataclass
class InputSpec:
    """One positional input of ``Model.forward``: a tensor (shape, dtype, stride) or a plain Python value."""

    kind: str  # "tensor" | "value"
    shape: list[int] | None = None
    dtype: str | None = None
    stride: list[int] | None = None
    value: Any = None

    def describe(self) -> str:
        if self.kind == "tensor":
            return f"{self.dtype}{list(self.shape or [])}"
        return repr(self.value)


@dataclass
class Problem:
    """A reference computation in KernelBench form, with its canonical key and roofline estimates."""

    name: str
    source: str
    key: str
    input_specs: list[InputSpec]
    init_inputs: list[Any]
    op_summary: dict[str, int]
    bytes_moved: int
    flops: int
    output_specs: list[InputSpec] = field(default_factory=list)
    graph_text: str = ""

    @property
    def dtypes(self) -> list[str]:
        return sorted({s.dtype for s in self.input_specs if s.kind == "tensor" and s.dtype})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Problem:
        data = dict(data)
        data["input_specs"] = [InputSpec(**s) for s in data.get("input_specs", [])]
        data["output_specs"] = [InputSpec(**s) for s in data.get("output_specs", [])]
        return cls(**data)

    def signature(self) -> str:
        """Short human-readable input signature, e.g. ``bf16[4096, 4096], bf16[4096]``."""
        return ", ".join(s.describe() for s in self.input_specs)


def exec_problem_source(source: str, filename: str = "<problem>") -> types.ModuleType:
    """Execute problem source in a fresh module and check it has the KernelBench entry points."""
    mod = types.ModuleType(f"ks_problem_{hashlib.sha1(source.encode()).hexdigest()[:10]}")
    mod.__file__ = filename
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        raise ProblemError(f"{filename}: syntax error at line {e.lineno}: {e.msg}") from None
    try:
        exec(code, mod.__dict__)
    except Exception as e:  # noqa: BLE001 - user code; report, never crash
        raise ProblemError(f"{filename}: executing the problem module failed: {type(e).__name__}: {e}") from None
    missing = [n for n in ("Model", "get_inputs") if not hasattr(mod, n)]
    if missing:
        raise ProblemError(
            f"{filename}: not a KernelBench-format problem; missing {', '.join(missing)} "
            "(expected `class Model(nn.Module)`, `get_inputs()` and optionally `get_init_inputs()`)"
        )
    if not hasattr(mod, "get_init_inputs"):
        mod.get_init_inputs = lambda: []
    return mod
