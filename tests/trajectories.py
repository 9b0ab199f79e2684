"""A search's record as the evolver stores it on a GPU, for the trajectory export's tests: steps between a parent and
its children, their stored verdicts, and a finished run with one kept step per move kind and one step for every reason
to drop."""

from __future__ import annotations

from kernel_cache.record import StepRecord
from kernel_cache.store import KernelStore
from ks_core.fingerprint import BACKEND_CUDA, EnvFingerprint
from ks_inductor.candidate import normalized_source_hash
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.judge.verdict import EvalResult, Timing

PARENT = "import triton\n\n\ndef launch():\n    k[(1,)](x, BLOCK=128, num_warps=4)\n"
CHILD = "import triton\n\n\ndef launch():\n    k[(1,)](x, BLOCK=256, num_warps=8)\n"


def variant(tag: str) -> str:
    """Another child: a different program (comments alone would be the same one to the judge's hash)."""
    return CHILD + f"\nTAG_{tag.upper()} = 1\n"


H100 = EnvFingerprint(BACKEND_CUDA, "NVIDIA H100 80GB HBM3", "sm_90", 32, 132, "2.11.0+cu130", "3.6.0", "cuda-13.0")


def step(run: str, key: str, child: str = CHILD, parent_speed: float = 1.0, lcb: float | None = 1.2,
         noise: float = 0.01, correct: bool = True, verdict: str = "accepted", prompt: str | None = None,
         response: str | None = None, mutation: str = "param", child_id: str = "c",
         fingerprint: EnvFingerprint | dict | None = H100) -> StepRecord:
    fp = fingerprint.to_json() if isinstance(fingerprint, EnvFingerprint) else fingerprint
    return StepRecord(run_id=run, problem_key=key, child_id=child_id, mutation=mutation, parent_id="p",
                      verdict=verdict, correct=correct, parent_speedup=parent_speed,
                      child_speedup=None if lcb is None else lcb + 0.05, parent_speedup_lcb=parent_speed - 0.02,
                      child_speedup_lcb=lcb, noise=noise, parent_source=PARENT, child_source=child, prompt=prompt,
                      response=response, fingerprint=fp)


def verdict(key: str, source: str, fp: EnvFingerprint, median_ms: float, iqr_ms: float, speedup: float,
            correct: bool = True) -> EvalResult:
    return EvalResult(correct=correct, verdict="accepted" if correct else "rejected", stage="done",
                      fingerprint=fp.to_json(), problem_key=key, candidate_hash=normalized_source_hash(source),
                      trials=5, timings={"candidate": Timing(median_ms, iqr_ms, median_ms * 0.98, 40),
                                         "eager": Timing(median_ms * speedup, 0.01, median_ms * speedup, 40)},
                      timing_meaningful=True, speedup_eager=speedup, speedup_eager_lcb=speedup - 0.05,
                      flags=[] if correct else ["mismatch"])


def timed_cache(store: KernelStore, fp: EnvFingerprint = H100) -> tuple[object, str]:
    """A finished search's record on ``fp``: one kept step per move kind (a parameter move stored with its
    fingerprint, an operator step stored without one, whose child's stored verdict carries it, an LLM edit with its
    own prompt), and one step for every reason to drop."""
    problem = small_problem("rmsnorm_bf16")
    store.upsert_problem(problem)
    run = store.start_run(problem.key, fp, {})
    key = problem.key

    def judged(source: str, median_ms: float, iqr_ms: float, speedup: float, correct: bool = True) -> None:
        store.add_evaluation(key, normalized_source_hash(source), verdict(key, source, fp, median_ms, iqr_ms, speedup,
                                                                          correct), run)

    def on(**kw: object) -> StepRecord:
        return step(run, key, **{"fingerprint": fp, **kw})

    judged(PARENT, 1.0, 0.01, 1.0)
    kept = [
        (on(), (0.8, 0.008, 1.25)),
        (on(child=variant("op"), mutation="split_k", child_id="c-op", fingerprint=None), (0.8, 0.004, 1.25)),
        (on(child=variant("llm"), mutation="llm-diff", child_id="c-llm", prompt="improve this", response="an edit"),
         (0.8, 0.008, 1.25)),
    ]
    dropped = [
        (on(child=variant("slow"), lcb=1.03, child_id="c-slow"), (0.97, 0.01, 1.03)),
        (on(child=variant("noisy"), noise=0.2, child_id="c-noisy"), (0.8, 0.16, 1.25)),
        (on(child=variant("bad"), correct=False, verdict="rejected", child_id="c-bad", mutation="split_k"), None),
        # A placeholder where the fingerprint should be, and no stored verdict to take one from.
        (on(child=variant("nohw"), child_id="c-nohw", fingerprint={"device": "GPU", "timed": True}), None),
    ]
    for s, timing in kept + dropped:
        if timing is not None:
            judged(s.child_source, *timing)
        store.add_step(s)
    store.add_step(StepRecord(run_id=run, problem_key=key, child_id="p", mutation="seed", verdict="accepted",
                              correct=True, child_source=PARENT, fingerprint=fp.to_json()))
    store.finish_run(run, {"lineage": [{"operator": "param", "parent_id": "p", "child_id": "c", "gain": 1.25}],
                           "winning_move": {"operator": "param", "parent_id": "p", "child_id": "c", "gain": 1.25},
                           "best_speedup": 1.25, "best": None})
    return problem, run
