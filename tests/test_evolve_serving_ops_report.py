"""The serving-op benchmark's account of a search (``benchmarks/gpu/evolve_serving_ops._search_spend``): per
structural variant, what was judged, what passed and was timed, and why the first rejected program failed."""

from __future__ import annotations

from kernel_cache.store import KernelStore
from ks_inductor.evolve.archive import Archive, Program
from ks_inductor.judge.backends import current_fingerprint


def _program(i: int, variant: str, correct: bool, speedup: float | None, feedback: str = "") -> Program:
    return Program(id=f"p{i}", source_hash=f"h{i}", candidate={"template": variant.split("/")[0],
                                                               "variant": variant.split("/")[1]},
                   descriptor={}, island=0, correct=correct, timed=speedup is not None,
                   speedups=[] if speedup is None else [speedup], feedback=feedback)


def test_the_report_counts_each_variant_and_keeps_its_first_rejection(tmp_path):
    from benchmarks.gpu.evolve_serving_ops import _search_spend

    store = KernelStore(f"sqlite:///{tmp_path / 'k.db'}")
    run = store.start_run("key", current_fingerprint("triton-interpret"), {})
    archive = Archive()
    for p in (_program(0, "inductor/inductor", False, None, "trial 1: output 0 is wrong: 1 of 32768 elements"),
              _program(1, "inductor/inductor", False, None, "a later failure"),
              _program(2, "rope/fused", True, 9.4),
              _program(3, "rope/fused", True, 9.9)):
        archive.add(p)
    store.save_run_state(run, {"archive": archive.to_json()})
    got = _search_spend(store, run)
    store.close()
    ind, fused = got["variants"]["inductor/inductor"], got["variants"]["rope/fused"]
    assert (ind["programs"], ind["passed"], ind["correct"], ind["best"]) == (2, 0, 0, None)
    assert ind["first_rejection"].startswith("trial 1: output 0 is wrong")
    assert (fused["programs"], fused["passed"], fused["correct"], fused["best"]) == (2, 2, 2, 9.9)
    assert fused["first_rejection"] is None
    assert got["programs"] == 4 and got["programs_until_within_2pct"] == 4
