"""The benchmark runner on a real GPU (skipped without one): a short llm-ops run where eager and Inductor must pass
their correctness checks and be timed, any other installed peer must pass or be reported failed with its reason,
and the ceilings are measured and the floor computed.

    KS_TEST_GPU=1 pytest tests/test_bench_gpu.py
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_llm_ops_decode_rmsnorm_on_gpu(tmp_path):
    from benchmarks.results import KERNELSMITH, OK, UNAVAILABLE, load_result
    from benchmarks.run import main

    out = tmp_path / "gpu.json"
    rc = main(["--suite", "llm-ops", "--ops", "rmsnorm,rope", "--dtypes", "bfloat16", "--phases", "decode",
               "--rounds", "3", "--rep-ms", "30", "--out", str(out), "--db", f"sqlite:///{tmp_path / 'k.db'}"])
    assert rc == 0
    r = load_result(out)
    assert r.ceilings["copy_bytes_per_s"] > 1e11 and r.ceilings["matmul_flops_per_s"]["bfloat16"] > 1e12
    assert r.env["device_name"] and r.env["torch"]
    for w in r.workloads:
        assert w.floor_ms and w.floor_bound == "memory"
        for name, t in w.tools.items():
            if name == KERNELSMITH or t.status == UNAVAILABLE:
                continue
            if name not in ("eager", "inductor") and t.status != OK:
                # Third-party peers may fail; the report must say why (Liger 0.8.5's RoPE disagreed with the
                # reference on 61427 of 65536 elements at the decode shape on the H200).
                assert t.error, (w.name, name)
                continue
            assert t.status == OK, (w.name, name, t.error)
            assert t.median_ms > 0 and t.n >= 3
            assert w.fraction_of_floor(name) < 1.05, (w.name, name)  # nothing beats the memory system
    assert (tmp_path / "gpu.md").exists() and (tmp_path / "gpu-speedup.png").exists()
