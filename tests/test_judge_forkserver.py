"""The judge's fork server: on the interpreter backend every worker is a fresh child of a warm parent that imported
torch, triton and the worker's modules once. Each job must still get a process of its own, exit statuses must still
reach the judge, and a candidate that kills the parent must not take the judge down with it."""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

HONEST = (CANDIDATES / "rmsnorm_ok.py").read_text()
FORWARD = "    def forward(self, x):\n"


def _with_forward_prologue(line: str, header: str = "") -> str:
    assert FORWARD in HONEST
    return header + HONEST.replace(FORWARD, FORWARD + f"        {line}\n")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("PPid:"))


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem_tracing import load_problem

    return load_problem(PROBLEMS / "rmsnorm.py")


@pytest.fixture()
def open_judge():
    from ks_inductor.judge import Judge, JudgeConfig

    # Static rules off: these candidates import os and patch torch, which the static rules alone would turn away.
    with Judge(JudgeConfig(backend="triton-interpret", static_rules=False, trials=2), spares=False) as j:
        yield j


def test_interpreter_workers_are_forked_children_of_the_warm_parent(open_judge):
    from ks_inductor.judge.forkserver import ForkedProcess

    pool = open_judge._pool
    assert pool.forks is not None and pool.forks.alive
    workers = [pool.take(None) for _ in range(2)]
    try:
        assert all(isinstance(w.proc, ForkedProcess) for w in workers)
        assert all(w.wait_ready(30) for w in workers)
        assert workers[0].proc.pid != workers[1].proc.pid
        assert {_ppid(w.proc.pid) for w in workers} == {pool.forks.proc.pid}
    finally:
        for w in workers:
            w.kill()
    # The parent reaps them and reports how they ended: SIGKILL, as from the judge's killpg.
    assert [w.proc.poll() for w in workers] == [-9, -9]


def test_each_job_gets_a_fresh_process(open_judge, problem):
    leak = _with_forward_prologue("pass", header="import torch\ntorch._ks_leaked = True\n")
    sees_leak = _with_forward_prologue(
        "assert not hasattr(torch, '_ks_leaked'), 'state of an earlier job leaked into this one'")
    open_judge.evaluate(problem, leak)
    r = open_judge.evaluate(problem, sees_leak)
    assert r.accepted, r.feedback_text()


def test_a_fork_server_that_dies_is_replaced_and_a_candidate_cannot_kill_it(open_judge, problem):
    import os
    import signal

    from ks_inductor.judge.sandbox import landlock_abi

    pool = open_judge._pool
    first = pool.forks.proc.pid
    killer = _with_forward_prologue("os.kill(os.getppid(), 9)", header="import os\n")
    r = open_judge.evaluate(problem, killer)
    if landlock_abi() >= 6:
        # The sandbox keeps a candidate's signals inside it: the parent lives on, and the candidate fails.
        assert not r.accepted and pool.forks.alive and pool.forks.proc.pid == first, r.feedback_text()
        os.kill(first, signal.SIGKILL)  # a parent that dies anyway
        pool.forks.proc.wait(timeout=10)
    assert pool.forks.proc.poll() is not None or not pool.forks.alive  # the parent is dead
    r = open_judge.evaluate(problem, HONEST)
    assert r.accepted, r.feedback_text()
    assert pool.forks is not None and pool.forks.alive and pool.forks.proc.pid != first  # and a new one serves


def test_a_parent_whose_children_cannot_use_the_device_is_refused_and_workers_start_from_scratch() -> None:
    """A GPU backend's fork server probes once that a forked child can run on the device. On this CPU-only host the
    probe fails, as it would wherever an import initialised the device in the parent: the server refuses with the
    reason, and the pool starts that device's workers from scratch instead."""
    import dataclasses
    import os
    import subprocess
    import tempfile

    from ks_inductor.judge.backends import detect_backend
    from ks_inductor.judge.forkserver import ForkServerError
    from ks_inductor.judge.pool import WorkerPool, _start_fork_server

    gpu_like = dataclasses.replace(detect_backend("triton-interpret"), device="cuda")
    server = _start_fork_server(gpu_like, tempfile.mkdtemp(), 0)
    assert server is not None  # started, not waited for
    with open(os.devnull, "wb") as sink, pytest.raises(ForkServerError, match="cannot initialise the device"):
        server.fork(sink.fileno(), tempfile.mkdtemp())
    assert server.refused and not server.alive

    # A pool whose parent was refused starts that device's workers from scratch, and stops asking the parent.
    pool = WorkerPool(detect_backend("triton-interpret"), [None], tempfile.mkdtemp(), spares=0)
    try:
        pool.fork_servers[None].close()
        pool.fork_servers[None] = server
        w = pool.take(None)
        assert w.wait_ready(60) and isinstance(w.proc, subprocess.Popen)  # started from scratch
        assert pool.fork_servers[None] is None
        w.kill()
    finally:
        pool.close()
