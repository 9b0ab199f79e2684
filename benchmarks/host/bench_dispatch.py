"""Per-call overhead of a swapped operation: the same tiny op called in eager, through plain Inductor, through
the kernelsmith backend (the cached kernel swapped in as a torch.library op), and as the bare kernel module.

Read the dispatch overhead as ``kernelsmith_swapped`` minus ``kernel_direct`` (both run the same interpreted
Triton kernel on CPU); ``eager`` and ``inductor`` show what a user pays without kernelsmith.

    pytest benchmarks/host/bench_dispatch.py -o python_files='bench_*.py' --benchmark-enable
"""

from __future__ import annotations

import pytest

from benchmarks.host.support import AFFINE_KERNEL, affine_model, backend_options, reset_compilers

torch = pytest.importorskip("torch")

GROUP = "dispatch (64 fp32 elements, CPU)"


@pytest.fixture()
def x():
    return torch.randn(64)


@pytest.mark.benchmark(group=GROUP)
def test_eager(benchmark, x):
    m = affine_model()
    with torch.no_grad():
        benchmark(m, x)


@pytest.mark.benchmark(group=GROUP)
def test_inductor(benchmark, x):
    reset_compilers()
    c = torch.compile(affine_model())
    with torch.no_grad():
        c(x)
        benchmark(c, x)


@pytest.mark.benchmark(group=GROUP)
def test_kernel_direct(benchmark, x):
    from benchmarks.kernelsmith_peer import load_kernel_module

    k = load_kernel_module(AFFINE_KERNEL).ModelNew()
    with torch.no_grad():
        torch.testing.assert_close(k(x), x * 2.0 + 1.0)
        benchmark(k, x)


@pytest.mark.benchmark(group=GROUP)
def test_kernelsmith_swapped(benchmark, x, ks_hit_db):
    from ks_inductor.compiler import backend as ks_backend

    reset_compilers()
    ks_backend.clear_reports()
    c = torch.compile(affine_model(), backend="kernelsmith", options=backend_options(ks_hit_db))
    with torch.no_grad():
        torch.testing.assert_close(c(x), x * 2.0 + 1.0)
        assert sum(r.swapped for r in ks_backend.compile_reports()) >= 1, "the kernel was not swapped in"
        benchmark(c, x)
