"""Kernel cache benchmarks (pytest-benchmark): lookup latency on a 100,000-kernel database, pack export/import.

Full run (builds the 100,000-kernel SQLite database once, in a temp dir; a minute or two on a small CPU box)::

    .venv/bin/pytest benchmarks/host/bench_cache.py --benchmark-enable -p no:cacheprovider

With benchmarks disabled (CI's ``--benchmark-disable``) each function runs once on a 2,000-kernel database, as
a smoke test; ``KS_BENCH_FULL=1`` forces the full size either way, ``KS_BENCH_KERNELS=N`` picks another size.

What is measured:
- ``lookup`` from a warm process, through the in-process memo (the steady state of a serving process) and
  through the database alone (``memo=False``: index scan + fingerprint match + record decode);
- a lookup that misses;
- exporting 1,000 kernels (100 problems x 10 kernels, golden vectors computed by running each reference), and
  importing that pack (verification, including the static safety rules on every kernel, plus the merge).
Problem keys here are synthetic (hashes of the generated sources): tracing 100 problems for canonical keys
would measure the tracer, not the cache.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import time
from pathlib import Path

import pytest

from kernel_cache.pack import export_pack
from kernel_cache.record import QUARANTINED, REJECTED, VERIFIED
from kernel_cache.store import KernelStore
from kernel_cache.testing import a100, h200, make_record
from ks_core.problem_record import InputSpec, Problem
from ks_inductor.judge.packs import import_pack

KERNELS_PER_KEY = 5
PACK_PROBLEMS, PACK_KERNELS_PER_PROBLEM = 100, 10


def _full(config: pytest.Config) -> bool:
    enabled = config.getoption("benchmark_enable", False) or not config.getoption("benchmark_disable", False)
    return os.environ.get("KS_BENCH_FULL") == "1" or bool(enabled)


@pytest.fixture(scope="module")
def big_db(request, tmp_path_factory):
    """A database of N kernels: N/5 keys, each with kernels on this H200, on an older software stack, on an
    A100, and some quarantined or rejected ones."""
    n = int(os.environ.get("KS_BENCH_KERNELS") or (100_000 if _full(request.config) else 2_000))
    path = tmp_path_factory.mktemp("bench") / "big.db"
    here, old_sw, other = h200(), h200(torch_version="2.10.0", triton_version="3.5.0"), a100()
    rng = random.Random(0)
    t0 = time.perf_counter()
    with KernelStore(str(path)) as s:
        batch = []
        for i in range(n):
            key = f"{i // KERNELS_PER_KEY:032x}"
            fp = (here, here, old_sw, other, here)[i % KERNELS_PER_KEY]
            status = VERIFIED if i % 7 else rng.choice([QUARANTINED, REJECTED])
            batch.append(make_record(key, str(i), fp, status=status, speedup_lcb=round(rng.uniform(0.8, 3.0), 3),
                                     median_ms=rng.uniform(0.01, 5.0)))
            if len(batch) == 10_000:
                s.add_kernels_bulk(batch)
                batch = []
        if batch:
            s.add_kernels_bulk(batch)
    build_s = time.perf_counter() - t0
    keys = [f"{k:032x}" for k in rng.sample(range(n // KERNELS_PER_KEY), min(1000, n // KERNELS_PER_KEY))]
    print(f"\nbuilt {n} kernels in {build_s:.1f} s ({path.stat().st_size / 2**20:.0f} MiB)")
    return {"path": str(path), "keys": keys, "n": n, "fp": here}


def _warm_lookup(benchmark, big_db, memo: bool, keys: list[str]) -> object:
    fp = big_db["fp"]
    with KernelStore(big_db["path"], memo=memo) as s:
        for k in keys:  # warm: imports, statement caches, page cache, and the memo when it is on
            s.lookup(k, fp)
        it = itertools.cycle(keys)
        benchmark.extra_info["kernels"] = big_db["n"]
        result = benchmark(lambda: s.lookup(next(it), fp))
    return result


def test_lookup_warm_memo(benchmark, big_db):
    _warm_lookup(benchmark, big_db, True, big_db["keys"])
    with KernelStore(big_db["path"]) as s:
        hits = sum(s.lookup(k, big_db["fp"]) is not None for k in big_db["keys"][:50])
    assert hits >= 45  # nearly every key has a verified kernel for this H200


def test_lookup_warm_database(benchmark, big_db):
    _warm_lookup(benchmark, big_db, False, big_db["keys"])


def test_lookup_miss_database(benchmark, big_db):
    _warm_lookup(benchmark, big_db, False, [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(100)])


def _problem(i: int) -> Problem:
    src = (
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, dim):\n"
        "        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.randn(dim))\n\n"
        "    def forward(self, x):\n"
        f"        return x * self.weight + {i}.0\n\n\n"
        "def get_inputs():\n    return [torch.randn(64, 256)]\n\n\n"
        "def get_init_inputs():\n    return [256]\n"
    )
    return Problem(name=f"scale_shift_{i}", source=src, key=hashlib.sha256(src.encode()).hexdigest()[:32],
                   input_specs=[InputSpec("tensor", [64, 256], "float32", [256, 1])], init_inputs=[256],
                   op_summary={"mul": 1, "add": 1}, bytes_moved=2 * 64 * 256 * 4, flops=2 * 64 * 256,
                   output_specs=[InputSpec("tensor", [64, 256], "float32", [256, 1])])


@pytest.fixture(scope="module")
def pack_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("pack")
    fp = h200()
    with KernelStore(str(d / "src.db")) as s:
        records = []
        for i in range(PACK_PROBLEMS):
            p = _problem(i)
            s.upsert_problem(p)
            records += [make_record(p.key, f"{i}-{j}", fp, speedup_lcb=1.0 + j / 10)
                        for j in range(PACK_KERNELS_PER_PROBLEM)]
        s.add_kernels_bulk(records)
    return {"dir": d, "db": str(d / "src.db"), "fp": fp}


def test_export_1000(benchmark, pack_db):
    out = pack_db["dir"] / "bench.kspack"
    with KernelStore(pack_db["db"]) as s:
        res = benchmark.pedantic(lambda: export_pack(s, out), rounds=3, iterations=1, warmup_rounds=1)
    assert res.kernels == PACK_PROBLEMS * PACK_KERNELS_PER_PROBLEM and res.with_vectors == PACK_PROBLEMS
    benchmark.extra_info["pack_bytes"] = res.size_bytes


def test_import_1000(benchmark, pack_db):
    pack = pack_db["dir"] / "import.kspack"
    with KernelStore(pack_db["db"]) as s:
        export_pack(s, pack)
    counter = itertools.count()

    def fresh_db():
        return (str(pack_db["dir"] / f"dest-{next(counter)}.db"),), {}

    def run(url: str) -> int:
        with KernelStore(url) as dest:
            return import_pack(Path(pack), dest, fingerprint=pack_db["fp"]).added

    added = benchmark.pedantic(run, setup=fresh_db, rounds=3, iterations=1, warmup_rounds=0)
    assert added == PACK_PROBLEMS * PACK_KERNELS_PER_PROBLEM
