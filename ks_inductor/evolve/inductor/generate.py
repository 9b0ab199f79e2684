"""Inductor's plans for a problem, made in a throwaway process and kept for the life of the search's process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

from ks_inductor.evolve.inductor.program import InductorProgram
from ks_inductor.problem import Problem

log = logging.getLogger(__name__)

# Structural variants, each one code generation: Inductor's own choice, its looped (non-persistent) reductions,
# and for matmuls its native Triton matmul (a tl.dot reduction kernel instead of a cuBLAS call).
VARIANTS: dict[str, dict[str, Any]] = {
    "inductor": {},
    "looped": {"persistent": False},
    "native_matmul": {"native_matmul": True},
}
_MATMUL_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "dot")
TIMEOUT_S = 300.0

_lock = threading.Lock()
_key_locks: dict[tuple[str, str], threading.Lock] = {}
_memo: dict[tuple[str, str], tuple[dict[str, InductorProgram], dict[str, str]]] = {}


def inductor_programs(problem: Problem, target: str) -> tuple[dict[str, InductorProgram], dict[str, str]]:
    """The distinct plans Inductor makes for ``problem`` on ``target`` ("cuda", or "cpu" for the interpreter, where
    code is generated for a stand-in sm_90 device), by variant name; and per variant that has none, why."""
    key = (problem.key, target)
    # One generation per problem, however many threads ask; different problems generate at once (a warm searching
    # several regions in parallel).
    with _lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        if key not in _memo:
            _memo[key] = _generate(problem, target)
        return _memo[key]


def _generate(problem: Problem, target: str) -> tuple[dict[str, InductorProgram], dict[str, str]]:
    wanted = {"inductor": VARIANTS["inductor"], "looped": VARIANTS["looped"]}
    if any(op in _MATMUL_OPS for op in problem.op_summary):
        wanted["native_matmul"] = VARIANTS["native_matmul"]
    job = {"source": problem.source, "name": problem.name, "target": target, "variants": wanted}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    try:
        proc = subprocess.run([sys.executable, "-m", "ks_inductor.evolve.inductor.codegen"], input=json.dumps(job),
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {}, {v: f"Inductor's code generation took over {TIMEOUT_S:.0f} s" for v in wanted}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, {v: f"Inductor's code generation failed: {tail}" for v in wanted}
    out = json.loads(proc.stdout)
    programs: dict[str, InductorProgram] = {}
    reasons: dict[str, str] = {}
    seen: list[list[str]] = []
    for variant, res in out.items():
        if "error" in res:
            reasons[variant] = res["error"]
            continue
        prog = InductorProgram.from_json(res["program"])
        sources = [k.source for k in prog.kernels]
        if sources in seen:
            continue  # the same kernels as an earlier variant (a problem without reductions or matmuls)
        seen.append(sources)
        programs[variant] = prog
    for variant, why in reasons.items():
        log.info("no Inductor seed (%s) for %s: %s", variant, problem.name, why)
    return programs, reasons
