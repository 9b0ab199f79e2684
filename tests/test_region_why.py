"""A region or problem that ends without a kernel says why, in one line: the best candidate's first reason, or why
the search stopped, carried by the evolve summary into warm's rows."""

from __future__ import annotations

from kernel_cache.record import REJECTED, VERIFIED, KernelRecord
from ks_inductor.evolve.evolver import WHY_CHARS, why_no_kernel
from ks_inductor.judge.verdict import EvalResult

NAN_TRIAL = "trial 2 (nan inputs): output 0 is wrong: 62 of 4096 elements outside tolerance"


def _rejected(*reasons: str) -> EvalResult:
    r = EvalResult()
    r.reasons = list(reasons)
    return r


def _record(status: str) -> KernelRecord:
    return KernelRecord(problem_key="k", source="", backend="cpu-interpret", fingerprint={}, status=status)


def test_no_correct_candidate_gives_the_first_judged_candidates_first_reason():
    why = why_no_kernel(None, None, "", [_rejected(NAN_TRIAL, "later"), _rejected("another")], "budget")
    assert why == NAN_TRIAL


def test_a_verified_kernel_needs_no_why_and_a_rejected_one_gives_its_verdict_or_the_runs_note():
    assert why_no_kernel(_record(VERIFIED), _rejected("x"), "", [], "budget") == ""
    slow = _rejected("not faster than inductor: 0.91x")
    assert why_no_kernel(_record(REJECTED), slow, "", [], "budget") == "not faster than inductor: 0.91x"
    assert why_no_kernel(_record(REJECTED), slow, "the final protocol was not run", [], "time") == \
        "the final protocol was not run"


def test_without_any_verdict_the_why_is_why_the_search_stopped_and_it_is_one_short_line():
    assert why_no_kernel(None, None, "", [], "time limit") == "no candidate was judged (time limit)"
    long = why_no_kernel(None, None, "", [_rejected("a\nb " + "c" * 400)], "")
    assert "\n" not in long and len(long) == WHY_CHARS and long.endswith("…")


class _Store:
    def lookup(self, key, fp):
        return None


def test_warm_rows_take_the_summarys_why():
    from ks_inductor.warm.run import WarmItem, apply_outcome

    item = WarmItem(key="k", name="conv", origin="model", signature="")
    apply_outcome(item, {"status": "done", "note": "", "summary": {"judged": 3, "accepted": 0, "why": NAN_TRIAL}},
                  _Store(), None)
    assert item.status == "no-kernel" and item.note == NAN_TRIAL
    other = WarmItem(key="k", name="conv", origin="model", signature="")
    apply_outcome(other, {"status": "done", "note": "", "summary": {"judged": 0, "accepted": 0}}, _Store(), None)
    assert other.status == "no-kernel" and other.note


def test_explain_gives_a_missed_region_the_why_its_last_search_stored(tmp_path):
    """A region that is still a miss shows why the latest search of its key stored no kernel, in explain's table and
    JSON, rather than only that the cache has none."""
    from kernel_cache.store import KernelStore
    from ks_core.fingerprint import EnvFingerprint
    from ks_inductor.compiler.explain import explain
    from ks_inductor.demo import build_model

    model, inputs = build_model()
    db = f"sqlite:///{tmp_path / 'k.db'}"
    store = KernelStore(db)
    before = explain(model, *inputs, db=db)
    missed = [r for g in before.graphs for r in g.regions if r.status == "miss" and r.key]
    assert missed
    key = missed[0].key
    fp = EnvFingerprint(backend="cpu-interpret", device_name="cpu", capability="", warp_size=1, sm_count=0,
                        torch_version="", triton_version="", toolchain="")
    store.finish_run(store.start_run(key, fp, {}), {"why": NAN_TRIAL})
    store.close()
    after = explain(model, *inputs, db=db).to_json()
    whys = {row["key"]: row["why"] for g in after["graphs"] for row in g["regions"]}
    assert whys[key] == f"last search: {NAN_TRIAL}"
    assert all(w != f"last search: {NAN_TRIAL}" for k, w in whys.items() if k != key)


def _timed(eager: float, lcb: float, graph: float | None, launch_bound: bool = False) -> EvalResult:
    r = EvalResult(correct=True, verdict="accepted", timing_meaningful=True, launch_bound=launch_bound)
    r.speedup_eager, r.speedup_eager_lcb = eager, lcb
    r.speedup_inductor, r.speedup_inductor_lcb = eager + 0.5, lcb + 0.5
    if graph is not None:
        r.steady_speedups = {"eager": graph, "inductor": graph + 0.5}
    return r


def test_a_correct_kernel_that_is_not_faster_says_which_ratio_kept_it_out():
    """The search's why for a correct best that is not faster names the ratio that failed (a per-call lower bound
    under the margin, or a CUDA-graph time above a baseline's) and whether a serving race is left to decide, rather
    than another candidate's reason."""
    bound = _timed(1.08, 1.01, 1.02)
    why = bound.speed_why(0.03)
    assert "per call" in why and "eager 1.010 (1.080x)" in why and "inductor" not in why and "graph" not in why
    graph = _timed(1.10, 1.06, 0.98, launch_bound=True)
    why = graph.speed_why(0.03)
    assert "CUDA graph" in why and "eager 0.980x" in why and "per call" not in why and "no race" in why
    tie = _timed(1.02, 0.99, 1.01, launch_bound=True)
    assert tie.served_by_race and "race decides" in tie.speed_why(0.03)
    fast = _timed(1.2, 1.1, 1.1)
    fast.faster = True
    assert fast.speed_why(0.03) == ""
    graph.not_faster = graph.speed_why(0.03)
    assert why_no_kernel(_record(REJECTED), graph, "", [_rejected(NAN_TRIAL)], "budget") == graph.not_faster
