"""Lookup latency of the kernel cache on PostgreSQL with 100,000 kernels: the memo hit and the cold lookup.

    .venv/bin/python -m benchmarks.cache_lookup_pg                 # a throwaway local server (Debian's binaries)
    .venv/bin/python -m benchmarks.cache_lookup_pg --db postgresql+psycopg://USER:PASS@HOST/DB   # an empty DB

The database has the shape of ``benchmarks/host/bench_cache.py``'s SQLite one: N/5 keys, each with kernels for
this H200, for an older software stack and for an A100, one in seven quarantined or rejected. Measured, each
as the median (and p90) of single lookups of random keys from one warm process, the kinds interleaved:

* ``memo_hit``: the steady state of a serving process: one round trip for the generation counter, then the
  in-process memo (what the backend pays per region on a compile that hits).
* ``cold``: the memo dropped before every lookup (as after any write): the counter, then the index scan,
  the JSON decode and the fingerprint match.
* ``database``: the lookup query alone (``memo=False``), no counter.
* ``miss``: a key with no kernel at all, memo off.
* ``first_lookup_new_process``: a fresh reader: connect, check the schema, first lookup (one sample per run).

The result goes to ``benchmarks/results/cache-lookup-pg-cpu-DATE.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KERNELS_PER_KEY = 5


def _build(url: str, n: int) -> tuple[list[str], float]:
    from kernel_cache.access import open_store
    from kernel_cache.record import QUARANTINED, REJECTED, VERIFIED
    from kernel_cache.testing import a100, h200, make_record

    here, old_sw, other = h200(), h200(torch_version="2.10.0", triton_version="3.5.0"), a100()
    rng = random.Random(0)
    t0 = time.perf_counter()
    with open_store(url) as s:
        if s.kernels(limit=1):
            raise SystemExit(f"{s.where} already holds kernels; pass an empty database")
        batch = []
        for i in range(n):
            key = f"{i // KERNELS_PER_KEY:032x}"
            fp = (here, here, old_sw, other, here)[i % KERNELS_PER_KEY]
            status = VERIFIED if i % 7 else rng.choice([QUARANTINED, REJECTED])
            batch.append(make_record(key, str(i), fp, status=status, speedup_lcb=round(rng.uniform(0.8, 3.0), 3),
                                     median_ms=rng.uniform(0.01, 5.0)))
            if len(batch) == 5_000:
                s.add_kernels_bulk(batch)
                batch = []
        if batch:
            s.add_kernels_bulk(batch)
    import psycopg

    from kernel_cache.postgres import conninfo

    with psycopg.connect(autocommit=True, **conninfo(url)) as conn:  # settle the bulk load before timing
        conn.execute("VACUUM ANALYZE kernels")
        conn.execute("CHECKPOINT")
    keys = [f"{k:032x}" for k in rng.sample(range(n // KERNELS_PER_KEY), min(2000, n // KERNELS_PER_KEY))]
    return keys, time.perf_counter() - t0


def _stats(samples_s: list[float]) -> dict[str, float]:
    us = sorted(x * 1e6 for x in samples_s)
    return {"median_us": round(statistics.median(us), 1), "p90_us": round(us[int(0.9 * (len(us) - 1))], 1),
            "min_us": round(us[0], 1), "n": len(us)}


_FIRST = r"""
import sys, time
t0 = time.perf_counter()
from kernel_cache.access import open_store
from kernel_cache.testing import h200
store = Lazyopen_store(sys.argv[1])
rec = store.lookup(sys.argv[2], h200())
print(time.perf_counter() - t0, store.fast, rec is not None, "sqlalchemy" in sys.modules)
"""


def measure(url: str, keys: list[str], rounds: int) -> dict[str, Any]:
    from kernel_cache.reader import PgReader
    from kernel_cache.testing import h200

    fp = h200()
    reader = PgReader(url)
    for k in keys:  # warm: connection, prepared statements, the server's buffers, the memo
        reader.lookup(k, fp)
    hits = sum(reader.lookup(k, fp) is not None for k in keys[:200])
    rng = random.Random(1)
    picks = [rng.choice(keys) for _ in range(rounds)]
    missing = [f"{rng.getrandbits(128):032x}" for _ in range(rounds)]
    samples: dict[str, list[float]] = {"cold": [], "memo_hit": [], "database": [], "miss": []}
    clock = time.perf_counter
    # Interleaved, so that whatever else the machine does (autovacuum, a checkpoint) falls on every kind alike.
    for k, m in zip(picks, missing):
        reader.invalidate()
        t0 = clock()
        reader.lookup(k, fp)
        t1 = clock()
        reader.lookup(k, fp)
        t2 = clock()
        reader.lookup(k, fp, memo=False)
        t3 = clock()
        reader.lookup(m, fp, memo=False)
        t4 = clock()
        for name, dt in (("cold", t1 - t0), ("memo_hit", t2 - t1), ("database", t3 - t2), ("miss", t4 - t3)):
            samples[name].append(dt)
    reader.close()
    first = []
    for k in keys[:5]:
        out = subprocess.run([sys.executable, "-c", _FIRST, url, k], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
        first.append(float(out[0]))
        assert out[1] == "True", "the backend's store did not take the psycopg fast path"
    return {
        **{name: _stats(v) for name, v in samples.items()},
        "first_lookup_new_process": {"median_ms": round(statistics.median(first) * 1e3, 1),
                                     "imports_included": True, "n": len(first),
                                     "sqlalchemy_imported": out[3] == "True"},
        "hit_rate_first_200": hits / min(200, len(keys)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="an empty PostgreSQL database (default: a throwaway local server)")
    ap.add_argument("--kernels", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5_000, help="lookups per measurement")
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/cache-lookup-pg-cpu-DATE.json)")
    a = ap.parse_args(argv)
    cluster = None
    url = a.db
    if url is None:
        from kernel_cache.testing_postgres import PostgresCluster, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl); install postgresql or pass --db URL")
        cluster = PostgresCluster(bindir).start()
        url = cluster.create_database()
    try:
        keys, build_s = _build(url, a.kernels)
        res = measure(url, keys, a.rounds)
        import psycopg

        from kernel_cache.postgres import conninfo

        with psycopg.connect(**conninfo(url)) as conn:
            server = conn.execute("SHOW server_version").fetchone()[0]
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    finally:
        if cluster is not None:
            cluster.stop()
    result = {
        "benchmark": "cache-lookup-pg", "kernels": a.kernels, "keys": a.kernels // KERNELS_PER_KEY,
        "build_s": round(build_s, 1), "database_mib": round(size / 2**20, 1), "server_version": server,
        "connection": "throwaway local server, unix socket" if cluster is not None else "--db",
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": _cpus()},
        "date": time.strftime("%Y-%m-%d"), **res,
    }
    default = ROOT / "benchmarks" / "results" / f"cache-lookup-pg-cpu-{result['date']}.json"
    out = Path(a.out) if a.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


if __name__ == "__main__":
    raise SystemExit(main())
