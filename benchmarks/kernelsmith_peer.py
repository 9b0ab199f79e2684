"""kernelsmith as a benchmark tool: the best verified kernel in the kernel cache for a problem on this machine.

Nothing is ever substituted for a missing kernel: no cached kernel means the row says "no verified kernel". With
an evolve budget, a miss first runs the optimizer (which stores what the judge accepts), then asks the cache again.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)


@dataclass
class KernelLookup:
    record: Any | None  # kernel_cache.record.KernelRecord
    reason: str = ""  # why there is none
    evolved: dict[str, Any] | None = None  # summary of an evolve run made for this miss

    def provenance(self) -> dict[str, Any] | None:
        r = self.record
        if r is None:
            return None
        return {"id": r.id, "sha256": r.sha256, "run_id": r.run_id, "candidate_id": r.candidate_id,
                "op_family": r.op_family, "fingerprint": r.fingerprint, "judge_speedup_eager": r.speedup_eager,
                "judge_speedup_inductor": r.speedup_inductor, "judge_speedup_lcb": r.speedup_lcb,
                "evolved_here": self.evolved}


class KernelSource:
    """Asks the kernel cache for kernels; optionally evolves on a miss. One per run."""

    def __init__(self, db_url: str | None, evolve_budget: int = 0, backend: str | None = None) -> None:
        self.db_url = db_url
        self.evolve_budget = evolve_budget
        self.backend = backend
        self._store: Any = None
        self._judge: Any = None
        self._fingerprint: Any = None
        self.error: str | None = None
        try:
            from kernel_cache.access import open_store
            from ks_inductor.judge.backends import detect_backend

            self._store = open_store(db_url)
            self._fingerprint = detect_backend(backend).fingerprint()
        except Exception as e:  # noqa: BLE001 - reported on every kernelsmith row, the run goes on
            self.error = f"kernel cache unavailable: {type(e).__name__}: {e}"
            log.warning("%s", self.error)

    def lookup(self, problem: Problem) -> KernelLookup:
        if self._store is None:
            return KernelLookup(None, self.error or "kernel cache unavailable")
        rec = self._store.lookup(problem.key, self._fingerprint)
        if rec is not None:
            return KernelLookup(rec)
        if self.evolve_budget <= 0:
            return KernelLookup(None, f"no verified kernel for key {problem.key[:16]} on "
                                      f"{self._fingerprint.short()}")
        evolved = self._evolve(problem)
        rec = self._store.lookup(problem.key, self._fingerprint)
        reason = "" if rec else f"no verified kernel after evolving ({evolved.get('error') or 'none accepted'})"
        return KernelLookup(rec, reason, evolved)

    def judge(self) -> Any:
        """One judge per run, shared by evolving and by suites that re-judge cached kernels."""
        if self._judge is None:
            from ks_inductor.judge import Judge, JudgeConfig

            self._judge = Judge(JudgeConfig.for_search(backend=self.backend))
        return self._judge

    def _evolve(self, problem: Problem) -> dict[str, Any]:
        try:
            from ks_inductor.evolve import EvolveConfig, evolve_problem

            self._store.upsert_problem(problem)
            s = evolve_problem(problem, EvolveConfig(budget=self.evolve_budget, backend=self.backend),
                               self._store, judge=self.judge(), progress=True)
            return {"budget": self.evolve_budget, "judged": s.judged, "accepted": s.accepted,
                    "wall_s": s.wall_s, "run_id": s.run_id, "best_speedup": s.best_speedup}
        except Exception as e:  # noqa: BLE001 - a failed evolve is a miss with a reason, not a crash
            log.exception("evolving %s failed", problem.name)
            return {"budget": self.evolve_budget, "error": f"{type(e).__name__}: {e}"}

    def close(self) -> None:
        if self._judge is not None:
            self._judge.close()
            self._judge = None
        if self._store is not None:
            self._store.close()
            self._store = None


_LOAD_DIR: Path | None = None


def _module_dir() -> Path:
    global _LOAD_DIR
    if _LOAD_DIR is None:
        _LOAD_DIR = Path(tempfile.mkdtemp(prefix="ks-bench-kernels-"))
    return _LOAD_DIR


def load_kernel_module(source: str) -> Any:
    """Import kernel source from a real file: ``@triton.jit`` reads its function's source through inspect, which
    fails for code exec'd from a string when not running under the interpreter."""
    from ks_inductor.source_module import load_source_module

    mod = load_source_module(source, "ks_bench_kernel", str(_module_dir()))
    if not hasattr(mod, "ModelNew"):
        raise LookupError("the cached kernel source defines no ModelNew")
    return mod


def build_kernel_model(source: str, init_inputs: list[Any], ref_model: Any, device: str) -> Any:
    """``ModelNew(*init_inputs)`` with the reference model's weights, as the judge verified it."""
    from ks_inductor.judge.inputs import place_model

    mod = load_kernel_module(source)
    model = mod.ModelNew(*init_inputs)
    ref_state = ref_model.state_dict()
    new_state = model.state_dict()
    if ref_state and set(ref_state) == set(new_state) and all(
            ref_state[k].shape == new_state[k].shape for k in ref_state):
        model.load_state_dict(ref_state)
    return place_model(model, device)
