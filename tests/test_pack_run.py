"""``pack verify --run``: the golden vectors re-run here, in the judge's sandbox, catch a wrong kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_cache.pack import export_pack
from kernel_cache.record import KernelRecord, source_sha256
from kernel_cache.store import KernelStore
from ks_inductor.judge.packs import verify_pack

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "tests" / "candidates"

pytestmark = pytest.mark.skipif(not (ROOT / "ks_inductor" / "judge" / "service.py").exists(),
                                reason="needs the judge service (ks_inductor/judge/service.py) for run_vectors")


def test_golden_vectors_pass_good_kernel_and_catch_wrong_one(tmp_path):
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.judge.backends import current_fingerprint
    from ks_inductor.problem_tracing import load_problem

    here = current_fingerprint("triton-interpret")
    problem = load_problem(ROOT / "tests" / "problems" / "rmsnorm.py")
    good = (CANDIDATES / "rmsnorm_ok.py").read_text()
    # Statically clean, hashes consistent, but its output has the wrong shape: only running it can tell.
    wrong = (CANDIDATES / "rmsnorm_wrong_shape.py").read_text()
    with KernelStore(str(tmp_path / "k.db")) as s:
        s.upsert_problem(problem)
        for src, ms in ((good, 1.0), (wrong, 2.0)):
            s.add_kernel(KernelRecord(problem.key, src, here.backend, here.to_json(), timed=False, median_ms=ms))
        export_pack(s, tmp_path / "p.kspack")
    with Judge(JudgeConfig(backend="triton-interpret"), spares=False) as judge:
        report = verify_pack(tmp_path / "p.kspack", fingerprint=here, run=True, judge=judge)
    by_sha = {k.sha256: k for k in report.kernels}
    assert by_sha[source_sha256(good)].vectors == "passed"
    assert by_sha[source_sha256(wrong)].vectors == "failed"
    assert not report.ok and "failed its golden vectors" in report.reasons[0]


@pytest.mark.gpu
def test_golden_vectors_on_gpu(tmp_path):
    """On a CUDA machine (KS_TEST_GPU=1): a pack verified for this GPU re-runs its vectors through the judge."""
    from ks_inductor.judge import Judge, JudgeConfig
    from ks_inductor.problem_tracing import load_problem

    problem = load_problem(ROOT / "tests" / "problems" / "rmsnorm.py")
    good = (CANDIDATES / "rmsnorm_ok.py").read_text()
    with Judge(JudgeConfig(backend="triton-cuda"), spares=False) as judge:
        here = judge.fingerprint
        with KernelStore(str(tmp_path / "k.db")) as s:
            s.upsert_problem(problem)
            s.add_kernel(KernelRecord(problem.key, good, here.backend, here.to_json(), speedup_lcb=1.1))
            export_pack(s, tmp_path / "p.kspack")
        report = verify_pack(tmp_path / "p.kspack", fingerprint=here, run=True, judge=judge)
    assert report.ok, report.reasons
    assert [k.vectors for k in report.kernels] == ["passed"]
