"""A search's children may share a worker process (``JudgeConfig.jobs_per_worker``): a worker whose job ended cleanly
takes the next one. Everything else keeps a process per job: a candidate that is rejected, flagged, or that leaves
anything in torch's namespace retires its worker; final judgments never share one. Interpreter judge, on the CPU."""

from __future__ import annotations

import pytest

from tests.conftest import CANDIDATES, PROBLEMS

HONEST = (CANDIDATES / "rmsnorm_ok.py").read_text()
EXPLOITS = CANDIDATES / "exploits"
FORWARD = "    def forward(self, x):\n"


def _variant(i: int) -> str:
    return HONEST + f"\n# child {i}\n"  # distinct sources, as a search's children are


def _with_forward_prologue(line: str, header: str = "") -> str:
    assert FORWARD in HONEST
    return header + HONEST.replace(FORWARD, FORWARD + f"        {line}\n")


def _kept_pids(judge) -> list[int]:
    return [w.proc.pid for ws in judge._pool._kept.values() for w in ws]


@pytest.fixture(scope="module")
def problem():
    from ks_inductor.problem import load_problem

    return load_problem(PROBLEMS / "rmsnorm.py")


def _judge(**overrides):
    from ks_inductor.judge import Judge, JudgeConfig

    # Static rules off: the leaking candidate below patches torch, which the static rules alone would turn away.
    cfg = JudgeConfig.for_search(backend="triton-interpret", trials=2, static_rules=False, **overrides)
    return Judge(cfg, spares=False)


def test_search_children_that_end_cleanly_share_one_worker_up_to_the_limit(problem):
    with _judge(jobs_per_worker=3) as j:
        first = j.evaluate(problem, _variant(0))
        assert first.accepted, first.feedback_text()
        [pid] = _kept_pids(j)
        for i in (1, 2):
            r = j.evaluate(problem, _variant(i))
            assert r.accepted, r.feedback_text()
        # The second and third children ran in the first one's process; the third was its last job.
        assert j._pool.reused == 2
        assert _kept_pids(j) == []
        r = j.evaluate(problem, _variant(3))
        assert r.accepted and j._pool.reused == 2
        assert _kept_pids(j) and _kept_pids(j)[0] != pid


def test_a_job_that_leaves_state_in_torch_retires_its_worker(problem):
    leak = _with_forward_prologue("pass", header="import torch\ntorch._ks_leaked = True\n")
    sees_leak = _with_forward_prologue(
        "assert not hasattr(torch, '_ks_leaked'), 'state of an earlier job leaked into this one'")
    with _judge() as j:
        assert j.evaluate(problem, leak).accepted  # nothing wrong with its own outputs
        assert _kept_pids(j) == []
        r = j.evaluate(problem, sees_leak)
        assert r.accepted, r.feedback_text()
        assert j._pool.reused == 0


def test_rejected_children_and_final_judgments_get_fresh_workers(problem):
    wrong = (CANDIDATES / "rmsnorm_wrong_shape.py").read_text()
    with _judge() as j:
        assert j.evaluate(problem, _variant(0)).accepted
        assert len(_kept_pids(j)) == 1
        r = j.evaluate(problem, wrong)  # takes the kept worker, and retires it
        assert r.verdict == "rejected" and j._pool.reused == 1
        assert _kept_pids(j) == []
        final = j.evaluate(problem, _variant(1), final=True)
        assert final.accepted and j._pool.reused == 1
        assert _kept_pids(j) == []  # a final judgment's process ends with it


def test_the_runtime_exploits_are_caught_by_workers_that_judged_honest_children_before(problem):
    """Each exploit comes after an honest child whose worker it then runs in: the guards installed afresh per job
    catch it as a fresh process would, and the next honest child is judged in a new process."""
    from tests.test_judge_exploits import RUNTIME, RUNTIME_ONLY

    cases = {**RUNTIME, **{k: v for k, v in RUNTIME_ONLY.items() if k != "kills_process.py"}}
    with _judge() as j:
        for i, (name, flag) in enumerate(sorted(cases.items())):
            honest = j.evaluate(problem, _variant(i))
            assert honest.accepted, honest.feedback_text()
            before = j._pool.reused
            r = j.evaluate(problem, (EXPLOITS / name).read_text())
            assert j._pool.reused == before + 1, f"{name} did not run in a kept worker"
            flags = flag if isinstance(flag, tuple) else (flag,)
            assert r.verdict == "rejected" and set(flags) & set(r.flags), (name, r.flags, r.reasons)
            assert _kept_pids(j) == [], f"{name}'s worker was kept"


def test_a_worker_that_dies_while_forgetting_its_job_is_not_handed_the_next_one(problem):
    """A child whose leftover ends its process only when the worker clears the child's module away (a garbage
    collector callback that exits once the module is gone, after the result went back): the worker never says ready
    again, so the next child goes to a fresh process and is judged on its own code, not charged with the other's
    exit."""
    dies_later = HONEST + (
        "\nimport gc as _gc\nimport os as _os\nimport sys as _sys\nimport time as _time\n\n\n"
        "def _exit_once_forgotten(phase, info, _name=__name__):\n"
        "    if _name not in _sys.modules:\n        _time.sleep(2.0)\n        _os._exit(7)\n\n\n"
        "_gc.callbacks.append(_exit_once_forgotten)\n")
    with _judge() as j:
        first = j.evaluate(problem, dies_later)
        assert first.accepted, first.feedback_text()
        assert len(_kept_pids(j)) == 1  # nothing in its result or the watched namespaces told against it
        r = j.evaluate(problem, _variant(1))
        assert r.accepted, r.feedback_text()
        assert j._pool.reused == 0
