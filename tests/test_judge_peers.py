"""A serving stack's own kernel as a baseline (``JudgeConfig.peers``): the trusted baselines job builds it with the
factory the config names, checks that it computes what the reference computes, and times it beside eager; a
factory that has no kernel for the problem, fails, or computes something else is left out, and the room says why."""

from __future__ import annotations

import pytest

from tests.conftest import PROBLEMS

FACTORIES = '''
def same(model, inputs):
    def own(*xs):
        return model(*xs)
    return own


def twice(model, inputs):
    return lambda *xs: 2 * model(*xs)


def nothing(model, inputs):
    return None


def broken(model, inputs):
    raise RuntimeError("no kernel on this device")
'''


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    folder = tmp_path_factory.mktemp("peers")
    (folder / "stack_kernels.py").write_text(FACTORIES)
    mp = pytest.MonkeyPatch()
    import os

    mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
    peers = {name: f"stack_kernels:{name}" for name in ("same", "twice", "nothing", "broken")}
    cfg = JudgeConfig(backend="triton-interpret", baselines=("eager", *peers, "unnamed"), peers=peers)
    try:
        with Judge(cfg) as judge:
            yield judge.room(load_problem(PROBLEMS / "rmsnorm.py"))
    finally:
        mp.undo()


def test_a_stack_kernel_is_timed_beside_eager(room):
    assert room.eager_ms and set(room.peer_ms) == {"same"}, (room.peer_ms, room.note)
    assert room.peer_ms["same"] > 0
    assert "same" in room.summary()


@pytest.mark.parametrize("name,why", [("twice", "computes something other than the reference"),
                                      ("nothing", "has no kernel for this problem"),
                                      ("broken", "no kernel on this device"),
                                      ("unnamed", "no factory makes the unnamed baseline")])
def test_a_stack_kernel_that_cannot_stand_is_left_out_with_why(room, name, why):
    assert name not in room.peer_ms
    assert f"{name} not timed: " in room.note and why in room.note, room.note


def test_a_search_may_name_only_the_peers_its_config_has():
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.evolver import search_judge_config

    jc = search_judge_config(EvolveConfig(baselines=("eager", "stack"), peers={"stack": "m:f"}))
    assert jc.baselines == ("eager", "stack") and jc.peers == {"stack": "m:f"}
    with pytest.raises(ValueError, match="stack"):
        search_judge_config(EvolveConfig(baselines=("eager", "stack")))
