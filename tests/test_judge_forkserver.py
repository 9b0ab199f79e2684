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
    from ks_inductor.problem import load_problem

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


def test_a_candidate_that_kills_the_fork_server_does_not_stop_the_judge(open_judge, problem):
    pool = open_judge._pool
    first = pool.forks.proc.pid
    killer = _with_forward_prologue("os.kill(os.getppid(), 9)", header="import os\n")
    open_judge.evaluate(problem, killer)
    assert pool.forks.proc.poll() is not None or not pool.forks.alive  # the parent is dead
    r = open_judge.evaluate(problem, HONEST)
    assert r.accepted, r.feedback_text()
    assert pool.forks is not None and pool.forks.alive and pool.forks.proc.pid != first  # and a new one serves
