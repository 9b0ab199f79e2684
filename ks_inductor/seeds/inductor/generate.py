"""Inductor's plans for a problem, made in a throwaway process and kept for the life of the search's process.

The throwaway processes are forked from a warm parent that imported torch and Inductor once
(``ks_inductor/judge/forkserver.py``): a generation's imports take about 3.8 of its 4.1 s on a 2-core x86-64 box
when it starts from nothing. Each generation still gets a process of its own that dies with it. Where the parent
cannot start, generations start from nothing (``KERNELSMITH_JUDGE_FORK=0`` turns forking off for both)."""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from ks_core.problem_record import Problem
from ks_inductor.seeds.inductor.program import InductorProgram

log = logging.getLogger(__name__)

# Structural variants, each one code generation: Inductor's own choice, its looped (non-persistent) reductions,
# for matmuls its native Triton matmul (a tl.dot reduction kernel instead of a cuBLAS call), and for GEMM- and
# convolution-led problems its max-autotune Triton template (the GEMM or convolution with its epilogue fused).
VARIANTS: dict[str, dict[str, Any]] = {
    "inductor": {},
    "looped": {"persistent": False},
    "native_matmul": {"native_matmul": True},
    "template": {"template": True},
}
_MATMUL_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "dot")
# Batched matmuls whose max-autotune template masks its loads with a form the Triton interpreter rejects ("mask has
# unsupported dtype"): on the interpreter they keep Inductor's own and native-matmul seeds.
_NO_INTERPRETER_TEMPLATE = ("bmm", "baddbmm")
_TEMPLATE_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "convolution", "conv1d", "conv2d", "conv3d",
                 "_convolution")
TIMEOUT_S = 300.0
CODEGEN_CMD = [sys.executable, "-m", "ks_inductor.seeds.inductor.codegen"]

# The caller's time limit (time.monotonic()), set around a search's seeding: a search's limit bounds its code
# generation too. A context variable, not an argument, so that the templates between the search and this module
# need not carry it.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("ks_codegen_deadline", default=None)


@contextlib.contextmanager
def codegen_deadline(at: float | None) -> Iterator[None]:
    """Code generation asked for within this block ends by ``at`` (``time.monotonic()``; None: no limit but
    :data:`TIMEOUT_S`)."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)

# target -> its warm parent (a ForkServer) and the parent's folder, started at the first generation of the process
_servers: dict[str, tuple[Any, str]] = {}
_server_lock = threading.Lock()
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
        if key in _memo:
            return _memo[key]
        programs, reasons, cut = _generate(problem, target, _deadline.get())
        if not cut:
            # Kept only when not cut short by a caller's limit: a later search with time left generates it.
            _memo[key] = programs, reasons
        return programs, reasons


def _generate(problem: Problem, target: str, deadline: float | None = None
              ) -> tuple[dict[str, InductorProgram], dict[str, str], bool]:
    """(plans, reasons, whether ``deadline`` cut the generation short)."""
    wanted = {"inductor": VARIANTS["inductor"], "looped": VARIANTS["looped"]}
    if any(op in _MATMUL_OPS for op in problem.op_summary):
        wanted["native_matmul"] = VARIANTS["native_matmul"]
    skipped: dict[str, str] = {}
    if any(op in _TEMPLATE_OPS for op in problem.op_summary):
        if target == "cpu" and any(op in _NO_INTERPRETER_TEMPLATE for op in problem.op_summary):
            skipped["template"] = ("Inductor's batched-matmul template masks its loads in a form the Triton "
                                   "interpreter does not run: it is a seed on a GPU only")
        else:
            wanted["template"] = VARIANTS["template"]
    timeout, by_deadline = TIMEOUT_S, False
    if deadline is not None and deadline - time.monotonic() < TIMEOUT_S:
        timeout, by_deadline = deadline - time.monotonic(), True
        if timeout <= 0:
            return {}, {v: "the search's time limit left no time for Inductor's code generation" for v in wanted}, True
    job = {"source": problem.source, "name": problem.name, "target": target, "variants": wanted}
    ran = _run_forked(job, target, timeout)
    if ran is None:
        ran = _run_fresh(job, timeout)
    stdout, stderr, code = ran
    if code is None:
        if by_deadline:
            return {}, {v: f"the search's time limit ended Inductor's code generation after {timeout:.0f} s"
                        for v in wanted}, True
        return {}, {v: f"Inductor's code generation took over {TIMEOUT_S:.0f} s" for v in wanted}, False
    if code != 0 or not stdout:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return {}, {v: f"Inductor's code generation failed: {tail}" for v in wanted}, False
    out = json.loads(stdout)
    programs: dict[str, InductorProgram] = {}
    reasons: dict[str, str] = dict(skipped)
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
    return programs, reasons, False


def _codegen_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    # Code generation only: nothing is compiled, so a pool of compile workers (one per core, in every one of the
    # generations a parallel warm runs at once) would only load the host that the judge's workers need.
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def _run_fresh(job: dict[str, Any], timeout: float) -> tuple[str, str, int | None]:
    """The generation in a process started from nothing: (stdout, stderr, exit code; None past ``timeout``)."""
    # A session of its own, so that a timeout ends whatever the generation started with it: a child holding the
    # output pipes would otherwise keep reading them to their end waiting.
    proc = subprocess.Popen(CODEGEN_CMD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_codegen_env(), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(json.dumps(job), timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "", "", None
    return stdout, stderr, proc.returncode


def _server(target: str) -> tuple[Any, str] | None:
    """The warm parent that forks ``target``'s generations and its folder, started at the first; None where forking
    is off or the parent could not come up (then generations start from nothing)."""
    from ks_core.settings import Settings
    from ks_inductor.judge.forkserver import ForkServer, ForkServerError

    if not Settings.read("judge_fork"):
        return None
    with _server_lock:
        if target in _servers:
            server, home = _servers[target]
            if server.alive or server.refused:
                return None if server.refused else (server, home)
            server.close()  # a generation killed it; start another
        else:
            if not _servers:
                atexit.register(_close_servers)
            home = tempfile.mkdtemp(prefix="ks-codegen-")
        try:
            server = ForkServer(_codegen_env(), home, name="codegen-forkserver", probe_device=target == "cuda",
                                wait=False, preload="ks_inductor.seeds.inductor.codegen:preload",
                                entry="ks_inductor.seeds.inductor.codegen:serve_forked")
        except (ForkServerError, OSError) as e:
            log.info("Inductor's code generation starts its processes from nothing: %s", e)
            if target not in _servers:  # nothing will use or remove the folder made for it
                shutil.rmtree(home, ignore_errors=True)
            return None
        _servers[target] = server, home
        return server, home


def _close_servers() -> None:
    with _server_lock:
        for server, home in _servers.values():
            server.close()
            shutil.rmtree(home, ignore_errors=True)
        _servers.clear()


def _run_forked(job: dict[str, Any], target: str, timeout: float) -> tuple[str, str, int | None] | None:
    """The generation in a process forked from the warm parent: as :func:`_run_fresh`, or None where there is no
    parent to fork from."""
    from ks_inductor.judge.forkserver import ForkServerError

    found = _server(target)
    if found is None:
        return None
    server, home = found
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log_file:
        try:
            proc, events = server.fork(log_file.fileno(), home)
        except ForkServerError as e:
            log.info("Inductor's code generation starts its processes from nothing: %s", e)
            return None
        data = b""
        try:
            with proc.stdin:
                proc.stdin.write(json.dumps(job).encode())
            while True:
                # The parent's first fork waits for its imports: that wait counts against the generation's limit.
                left = timeout - (time.monotonic() - t0)
                if left <= 0 or not select.select([events], [], [], left)[0]:
                    proc.kill()
                    proc.wait(timeout=10)
                    return "", "", None
                chunk = os.read(events, 1 << 16)
                if not chunk:
                    break
                data += chunk
            code = proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            proc.kill()
            return "", f"the forked generation failed: {e}", 1
        finally:
            os.close(events)
        log_file.seek(0)
        return data.decode(), log_file.read().decode(errors="replace"), code
