"""The evolution loop on CPU with the interpreter judge: seeds, mutation, archive, steps, the untimed winner in
the cache, resume after an interruption, no candidate judged twice, and the CLI."""

from __future__ import annotations

import json

import pytest

from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from ks_inductor.candidate import normalized_source_hash
from ks_inductor.catalogue import PROBLEM_DIR
from ks_inductor.catalogue.sources import module, shrink, small_problem
from ks_inductor.evolve import EvolveConfig, evolve_problem
from ks_inductor.evolve.evolver import EvolveError
from ks_inductor.judge import Judge, JudgeConfig
from ks_inductor.problem_tracing import problem_from_source


@pytest.fixture(scope="module")
def judge():
    with Judge(JudgeConfig(backend="triton-interpret", trials=2)) as j:
        yield j


class _CtrlC:
    """The user pressing Ctrl-C after ``n`` judgments were handed to the judge."""

    def __init__(self, judge, n: int) -> None:
        self._judge, self._n = judge, n

    def __getattr__(self, name):
        return getattr(self._judge, name)

    def submit(self, *a, **kw):
        if self._n == 0:
            raise KeyboardInterrupt
        self._n -= 1
        return self._judge.submit(*a, **kw)


def test_loop_resumes_and_stores_an_untimed_winner(judge, tmp_path) -> None:
    problem = small_problem("rmsnorm_bf16")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    # The template's seeds alone (Inductor's off), so that a budget of 5 leaves room for children.
    cfg = EvolveConfig(budget=5, islands=2, parallel=2, seed=3, inductor_seeds=False)
    with pytest.raises(KeyboardInterrupt):
        evolve_problem(problem, cfg, store, judge=_CtrlC(judge, 3), progress=False)
    run_id = store.latest_run(problem.key, judge.fingerprint)
    state = store.load_run_state(run_id)
    # Judgments still in flight at the interruption are not counted: they are redone after the resume.
    assert state is not None and 1 <= state["judged"] <= 3 and state["judged"] == len(store.steps(run_id=run_id))
    summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
    assert summary.run_id == run_id and summary.judged == 5 and summary.accepted >= 3
    assert summary.family == "rmsnorm" and not summary.timed and summary.best_speedup is None
    rec = summary.best
    assert rec is not None and rec.timed is False and rec.status == "verified"
    assert rec.fingerprint["backend"] == "cpu-interpret"
    assert store.lookup(problem.key, judge.fingerprint) is not None
    assert store.lookup(problem.key, h200()) is None  # interpreter kernels never serve a GPU
    steps = store.steps(run_id=run_id)
    assert len(steps) == 5
    hashes = [normalized_source_hash(s.child_source) for s in steps]
    assert len(set(hashes)) == len(hashes)  # nothing judged twice, across the interruption too
    assert {s.mutation for s in steps} >= {"seed"} and all(s.verdict for s in steps)
    children = [s for s in steps if s.parent_id]
    assert children and all(s.parent_source and s.diff for s in children)
    store.close()


def test_problem_without_template_or_llm_is_a_clear_error(judge, tmp_path) -> None:
    # A dilated convolution: no op-family template, and none of Inductor's Triton templates covers it either.
    source = module("        return F.conv2d(xs[0], xs[1], dilation=2)",
                    "[torch.randn(1, 2, 10, 10), torch.randn(3, 2, 3, 3)]")
    problem = problem_from_source(source, name="conv")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    with pytest.raises(EvolveError, match="no seed for conv.*convolution"):
        evolve_problem(problem, EvolveConfig(budget=2), store, judge=judge, progress=False)
    store.close()


def test_cli_evolve_and_export(tmp_path, capsys) -> None:
    from ks_inductor.cli import main

    prob = tmp_path / "silu.py"
    prob.write_text(shrink((PROBLEM_DIR / "silu_mul_bf16.py").read_text()))
    db = f"sqlite:///{tmp_path}/k.db"
    rc = main(["evolve", str(prob), "--backend", "triton-interpret", "--budget", "2", "--db", db, "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["judged"] == 2 and out["best"]["timed"] is False and out["family"] == "act_mul"
    rc = main(["export-trajectories", "--format", "sft", "--db", db, "-o", str(tmp_path / "t.jsonl"), "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and (tmp_path / "t.jsonl").read_text() == ""  # untimed steps carry no gain to keep
    # Every step judged is stored with the interpreter's fingerprint, and every one is counted under a reason.
    with KernelStore(db) as store:
        steps = store.steps()
    judged = [s for s in steps if s.child_id]
    assert judged and all(s.fingerprint and s.fingerprint["backend"] == "cpu-interpret"
                          and s.fingerprint["device_name"] for s in judged)
    device = "{device_name} (interpret, cpu-interpret)".format(**judged[0].fingerprint)
    assert got["steps"] == len(steps) == got["devices"][device]["steps"] and got["kept"] == 0
    assert sum(got["dropped"].values()) == len(steps) and got["dropped"]["no_hardware"] == 0
    assert (tmp_path / "t.card.md").read_text().count(f"| {device} | {len(steps)} | 0 |") == 1
    assert main(["evolve", str(tmp_path / "missing.py"), "--db", db]) == 2


@pytest.mark.gpu
def test_gpu_loop_stores_a_timed_winner(tmp_path) -> None:
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(PROBLEM_DIR / "rmsnorm_bf16.py")
    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    summary = evolve_problem(problem, EvolveConfig(budget=8, backend="triton-cuda"), store, progress=False)
    assert summary.timed and summary.best is not None and summary.best.timed
    assert summary.best_speedup is not None and summary.best.fingerprint["backend"] == "cuda"
    steps = store.steps(run_id=summary.run_id)
    assert any(s.child_speedup_lcb is not None and s.noise is not None for s in steps)
    # The search timed children against eager only; the winner was judged again with the final protocol.
    final = summary.best_result
    assert final is not None and final.final and {"eager", "inductor"} <= set(final.timings)
    assert summary.best.inductor_ms is not None and summary.best.median_ms == final.candidate_ms
    assert (summary.best.status == "verified") == final.faster
    store.close()


def _leader(i: int, faster: bool, score: float):
    """Leader ``i``'s final judgment: its speedups over the baselines, per call and in a graph."""
    from ks_inductor.evolve.archive import Program
    from ks_inductor.judge.verdict import EvalResult

    prog = Program(id=f"p{i}", source_hash=f"h{i}", candidate={}, descriptor={}, island=0, correct=True, timed=True)
    res = EvalResult(correct=True, verdict="accepted", timing_meaningful=True, faster=faster,
                     speedup_eager=score, speedup_inductor=score, steady_speedups={"inductor": score})
    return i, prog, res


def test_final_choice_among_leaders_is_made_on_their_final_scores() -> None:
    from ks_inductor.evolve.evolver import head_to_head, pick_final

    # Leader 1 scored higher than leader 0 against the same baselines, by more than the band: it wins.
    finals = [_leader(0, True, 1.25), _leader(1, True, 1.30), _leader(2, True, 1.28)]
    assert head_to_head(finals) == {"p1": pytest.approx(1.25 / 1.30), "p2": pytest.approx(1.25 / 1.28)}
    assert pick_final(finals)[0].id == "p1"
    # Within the band (noise between equals) the first leader stays.
    finals = [_leader(0, True, 1.30), _leader(1, True, 1.305)]
    assert pick_final(finals)[0].id == "p0"
    # A leader that does not qualify to be served never wins on speed.
    finals = [_leader(0, True, 1.10), _leader(1, False, 1.50)]
    assert pick_final(finals)[0].id == "p0"
    # Leader 0 not qualifying: the others' judgments decide, by score.
    finals = [_leader(0, False, 1.00), _leader(1, True, 1.10), _leader(2, True, 1.20)]
    assert pick_final(finals)[0].id == "p2"
