"""Compile time when every region hits the kernel cache, against plain Inductor and against a kernelsmith compile
that misses (falls back to Inductor), each from a fresh Dynamo state. One "compile" is torch.compile plus the
first call, which is when Dynamo traces and the backend runs.

    pytest benchmarks/host/bench_compile_hit.py -o python_files='bench_*.py' --benchmark-enable
"""

from __future__ import annotations

import pytest

from benchmarks.host.support import affine_model, backend_options, reset_compilers

torch = pytest.importorskip("torch")

GROUP = "compile + first call (affine model, CPU)"
ROUNDS = 5


def _compile_and_call(backend: str, options: dict | None) -> None:
    x = torch.randn(64)
    c = torch.compile(affine_model(), backend=backend, options=options)
    with torch.no_grad():
        c(x)


@pytest.mark.benchmark(group=GROUP)
def test_inductor_compile(benchmark):
    benchmark.pedantic(_compile_and_call, args=("inductor", None), setup=reset_compilers, rounds=ROUNDS,
                       iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group=GROUP)
def test_kernelsmith_compile_hit(benchmark, ks_hit_db):
    from ks_inductor.compiler import backend as ks_backend

    ks_backend.clear_reports()
    benchmark.pedantic(_compile_and_call, args=("kernelsmith", backend_options(ks_hit_db)), setup=reset_compilers,
                       rounds=ROUNDS, iterations=1, warmup_rounds=1)
    reports = ks_backend.compile_reports()
    assert reports and all(r.swapped >= 1 for r in reports), "a compile did not hit the cache"


@pytest.mark.benchmark(group=GROUP)
def test_kernelsmith_compile_miss(benchmark, tmp_path):
    try:
        from ks_inductor.compiler import backend as ks_backend
    except ImportError as e:
        pytest.skip(f"the kernelsmith backend is not importable yet: {e}")
    empty_db = f"sqlite:///{tmp_path / 'empty.db'}"
    ks_backend.clear_reports()
    benchmark.pedantic(_compile_and_call, args=("kernelsmith", backend_options(empty_db)), setup=reset_compilers,
                       rounds=ROUNDS, iterations=1, warmup_rounds=1)
    reports = ks_backend.compile_reports()
    assert reports and all(r.swapped == 0 for r in reports)
