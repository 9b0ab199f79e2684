"""Fixtures for the host-side benchmarks; see benchmarks/host/support.py for how the cache hit is made.

    pytest benchmarks/host -o python_files='bench_*.py' --benchmark-enable
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest  # noqa: E402

from benchmarks.host.support import AFFINE_KERNEL, affine_model, backend_options, reset_compilers  # noqa: E402


@pytest.fixture(scope="session")
def ks_hit_db(tmp_path_factory) -> str:
    """URL of a kernel cache holding a verified kernel for the affine model's region."""
    import torch

    try:
        from kernel_cache.access import open_store
        from kernel_cache.record import KernelRecord
        from ks_inductor.compiler import backend as ks_backend
        from ks_inductor.judge.backends import current_fingerprint
    except ImportError as e:
        pytest.skip(f"the kernelsmith backend or kernel cache is not importable yet: {e}")
    db = f"sqlite:///{tmp_path_factory.mktemp('ks-host') / 'kernels.db'}"
    x = torch.randn(64)
    reset_compilers()
    torch.compile(affine_model(), backend="kernelsmith", options=backend_options(db, "record"))(x)
    fp = current_fingerprint("triton-interpret")
    with open_store(db) as store:
        misses = store.misses()
        if not misses:
            pytest.skip("compiling the affine model recorded no miss; cannot build a cache hit")
        for m in misses:
            store.add_kernel(KernelRecord(problem_key=m["key"], source=AFFINE_KERNEL, backend="triton-interpret",
                                          fingerprint=fp.to_json(), timed=False, trials=5))
    ks_backend.forget_stores()
    reset_compilers()
    ks_backend.clear_reports()
    out = torch.compile(affine_model(), backend="kernelsmith", options=backend_options(db))(x)
    swapped = sum(r.swapped for r in ks_backend.compile_reports())
    if not swapped:
        reports = [r.to_json() for r in ks_backend.compile_reports()]
        pytest.skip(f"the backend did not swap the cached kernel in: {reports}")
    torch.testing.assert_close(out, x * 2.0 + 1.0)
    reset_compilers()
    return db
