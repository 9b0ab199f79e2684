"""The benchmark result file: plain dataclasses, JSON in and out, one file per run.

A run holds the environment it ran in, the machine ceilings measured at its start, the timing protocol, and one
:class:`WorkloadResult` per workload. Each tool (eager, Inductor, Liger, kernelsmith, ...) gets a
:class:`ToolResult`: either timings (median, IQR, min, sample count, per-round medians) or the reason it has none
(failed its correctness check, unavailable, no verified kernel). Nothing is ever timed without having passed the
correctness check first.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

# Tool statuses.
OK = "ok"
FAILED = "failed"  # ran, but its output disagrees with the reference (or it raised)
UNAVAILABLE = "unavailable"  # the tool is not installed here or has no such op
NO_KERNEL = "no verified kernel"  # kernelsmith: the cache holds no verified kernel for this problem and machine

KERNELSMITH = "kernelsmith"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class ToolResult:
    status: str
    median_ms: float | None = None
    iqr_ms: float | None = None
    min_ms: float | None = None
    n: int = 0
    round_medians_ms: list[float] = field(default_factory=list)
    error: str | None = None
    max_abs_error: float | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK and self.median_ms is not None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Speedup:
    """How many times faster kernelsmith is than a peer (peer median / kernelsmith median) and the lower 5%
    confidence bound of that ratio from a bootstrap over the interleaved rounds."""

    ratio: float
    lcb: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WorkloadResult:
    name: str
    op: str
    dtype: str
    phase: str
    shape: str
    problem_key: str = ""
    bytes_moved: int = 0
    flops: int = 0
    floor_ms: float | None = None
    floor_bound: str | None = None  # "memory" | "compute"
    tools: dict[str, ToolResult] = field(default_factory=dict)
    speedups: dict[str, Speedup] = field(default_factory=dict)  # kernelsmith vs each peer
    kernel: dict[str, Any] | None = None  # provenance of the kernelsmith kernel (cache id, sha256, run id)
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived figures used by the report and the closing note
    def peers(self) -> dict[str, ToolResult]:
        return {k: v for k, v in self.tools.items() if k != KERNELSMITH}

    def best_peer(self) -> tuple[str, ToolResult] | None:
        ok = {k: v for k, v in self.peers().items() if v.ok}
        if not ok:
            return None
        name = min(ok, key=lambda k: ok[k].median_ms)  # type: ignore[arg-type,return-value]
        return name, ok[name]

    def fraction_of_floor(self, tool: str) -> float | None:
        t = self.tools.get(tool)
        if not t or not t.ok or not self.floor_ms:
            return None
        return self.floor_ms / t.median_ms  # type: ignore[operator]

    def ratio_to_best_peer(self) -> float | None:
        ks = self.tools.get(KERNELSMITH)
        best = self.best_peer()
        if not ks or not ks.ok or best is None:
            return None
        return best[1].median_ms / ks.median_ms  # type: ignore[operator]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tools"] = {k: v.to_json() for k, v in self.tools.items()}
        d["speedups"] = {k: v.to_json() for k, v in self.speedups.items()}
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkloadResult:
        data = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        data["tools"] = {k: ToolResult.from_json(v) for k, v in (data.get("tools") or {}).items()}
        data["speedups"] = {k: Speedup(**v) for k, v in (data.get("speedups") or {}).items()}
        return cls(**data)


@dataclass
class RunResult:
    suite: str
    created: str
    command: str
    env: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    workloads: list[WorkloadResult] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    smoke: bool = False  # tiny shapes or CPU clock: exercises the runner, measures nothing
    schema: int = SCHEMA_VERSION

    def workload(self, name: str) -> WorkloadResult | None:
        return next((w for w in self.workloads if w.name == name), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["workloads"] = [w.to_json() for w in self.workloads]
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        if not isinstance(data, dict) or "suite" not in data or "workloads" not in data:
            raise ValueError("not a kernelsmith benchmark result (expected an object with 'suite' and 'workloads')")
        if int(data.get("schema", 1)) > SCHEMA_VERSION:
            raise ValueError(f"result schema {data['schema']} is newer than this kernelsmith reads "
                             f"({SCHEMA_VERSION}); upgrade kernelsmith")
        d = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        d["workloads"] = [WorkloadResult.from_json(w) for w in d.get("workloads", [])]
        return cls(**d)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically, so an interrupted run leaves the previous complete file behind."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")
        os.replace(tmp, p)
        return p


def load_result(path: str | os.PathLike[str]) -> RunResult:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"result file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    try:
        return RunResult.from_json(data)
    except (TypeError, KeyError) as e:
        raise ValueError(f"{p}: malformed benchmark result: {e}") from None


def spread(values: list[float | None]) -> dict[str, float] | None:
    """The min, median and max of a figure measured over several runs, and how many there were (None ones left
    out); None when there is none."""
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def default_result_path(suite: str, device_name: str, when: _dt.date | None = None) -> Path:
    """``benchmarks/results/<suite>-<device>-<date>.json``."""
    day = (when or _dt.date.today()).isoformat()
    return RESULTS_DIR / f"{slug(suite)}-{slug(device_name)}-{day}.json"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
