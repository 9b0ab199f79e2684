"""The kernel cache on a real PostgreSQL server: schema creation racing in several processes, concurrent writers
with the same keys, a writer killed mid-run, the lookup memo's invalidation, gc, packs, trajectories, the CLI,
the backend serving a hit, and the one-line error for a server that cannot be reached.

The server is a throwaway cluster (tests/postgres_server.py); without its binaries these tests skip, saying why,
except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_cache.errors import CacheError, CorruptDatabaseError, DatabaseUnavailableError
from kernel_cache.reader import PgReader
from kernel_cache.record import QUARANTINED, REJECTED, StepRecord
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200, make_record
from tests.postgres_server import unavailable
from tests.writers import BATCH, KILLED_WRITER, ROOT, subprocess_env

try:
    import psycopg
except ImportError:  # the tests that need it ask postgres_cluster, which skips (or fails under CI) saying why
    psycopg = None


# Processes start, import, then wait for "go": the race is on what they do with the database, not on imports.
_BARRIER = r"""
import os, sys, time
tmp, wid = sys.argv[-2], sys.argv[-1]
open(os.path.join(tmp, f"ready-{wid}"), "w").close()
while not os.path.exists(os.path.join(tmp, "go")):
    time.sleep(0.005)
"""

_OPEN_EMPTY = r"""
import sys
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200, make_record
""" + _BARRIER + r"""
with KernelStore(sys.argv[1]) as store:
    store.add_kernel(make_record(f"key-{wid}", "a", h200()))
    print(store.schema_version)
"""

_SAME_KEYS = r"""
import json, sys
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200, make_record
from ks_core.problem_record import InputSpec, Problem
store = KernelStore(sys.argv[1])
n = int(sys.argv[2])
""" + _BARRIER + r"""
w = int(wid)
fp = h200()
problem = Problem(name="add1", source="x + 1", key="p" * 32, input_specs=[InputSpec("tensor", [4, 8], "float32", [8, 1])],
                  init_inputs=[], op_summary={"add": 1}, bytes_moved=256, flops=32)
added = []
for i in range(n):
    # Every writer stores the same kernels (one row each must come out), and its own ones.
    store.add_kernel(make_record("shared", f"k{i}", fp, speedup_lcb=1.0 + w / 10))
    store.add_kernel(make_record(f"own-{w}", f"k{i}", fp))
    # The same batch in every writer, in opposite orders: two imports of one pack at once.
    batch = [make_record("merged", f"m{i}-{j}", fp) for j in range(6)]
    outcomes = store.merge([problem], batch if w % 2 else batch[::-1])
    added += [o.kernel_id for o in outcomes if o.action == "added"]
    store.record_miss(problem, fp)
    store.upsert_problem(problem)
store.close()
print(json.dumps(added))
"""

def _start_together(tmp_path: Path, script: str, args: list[str], n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", script, *args, str(tmp_path), str(w)], cwd=ROOT, env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(n)]
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("ready-*"))) < n and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    (tmp_path / "go").touch()
    return procs


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


def test_processes_creating_the_schema_at_once_all_succeed(tmp_path, postgres_url):
    procs = _start_together(tmp_path, _OPEN_EMPTY, [postgres_url], 5)
    from kernel_cache.migrations import CURRENT_VERSION

    assert [o.strip() for o in _finish(procs)] == [str(CURRENT_VERSION)] * 5
    with KernelStore(postgres_url) as s:
        assert len(s.kernels()) == 5
    with psycopg.connect(**_connect_kwargs(postgres_url)) as conn:
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'kernels_generation'").fetchone()[0] == 1


def test_concurrent_writers_with_the_same_keys_lose_and_duplicate_nothing(tmp_path, postgres_url):
    KernelStore(postgres_url).close()
    writers, n = 4, 12
    outs = _finish(_start_together(tmp_path, _SAME_KEYS, [postgres_url, str(n)], writers))
    added = [json.loads(o) for o in outs]
    with KernelStore(postgres_url) as s:
        shared = s.kernels(problem_key="shared")
        assert len(shared) == n and len({r.sha256 for r in shared}) == n
        # The verdict committed last stands: one of the writers' values, whole.
        assert {r.speedup_lcb for r in shared} <= {1.0 + w / 10 for w in range(writers)}
        for w in range(writers):
            assert len(s.kernels(problem_key=f"own-{w}")) == n
        merged = {r.id for r in s.kernels(problem_key="merged")}
        assert len(merged) == n * 6
        # Each merged kernel was added by exactly one writer; the others kept it.
        flat = [k for a in added for k in a]
        assert sorted(flat) == sorted(merged)
        [miss] = s.misses()
        assert miss["count"] == writers * n
        assert s.stats().problems == 1


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_writer_killed_mid_run_loses_no_committed_row(tmp_path, postgres_url):
    log = tmp_path / "committed.log"
    KernelStore(postgres_url).close()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, postgres_url, str(log)], cwd=ROOT, env=subprocess_env(),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("batch") >= 4:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    committed: set[int] = set()
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "solo" and len(parts) == 2:
            committed.add(int(parts[1]))
        elif parts and parts[0] == "batch" and len(parts) == BATCH + 2:  # a line cut by the kill is not counted
            committed.update(int(x) for x in parts[2:])
    assert len(committed) >= 4 * (BATCH + 1)
    with KernelStore(postgres_url) as s:
        ids = {r.id for r in s.kernels()}
        assert committed <= ids
        assert len(s.kernels(problem_key="batch")) % BATCH == 0  # a batch lands whole or not at all
        # The killed writer's open transaction (and its lock on the generation row) died with its connection.
        t0 = time.monotonic()
        s.add_kernel(make_record("after", "x", h200()))
        assert time.monotonic() - t0 < 5


def _connect_kwargs(url: str) -> dict:
    from kernel_cache.postgres import conninfo

    return conninfo(url)


def test_lookup_memo_is_dropped_by_any_write(postgres_url):
    fp = h200()
    with KernelStore(postgres_url) as reader, KernelStore(postgres_url) as writer:
        assert isinstance(reader._reader, PgReader) and reader._memo_enabled
        calls = []
        real = reader._reader._lookup_db
        reader._reader._lookup_db = lambda *a: calls.append(a) or real(*a)
        assert reader.lookup("p", fp) is None
        assert reader.lookup("p", fp) is None and len(calls) == 1  # served from the memo
        a = writer.add_kernel(make_record("p", "a", fp, speedup_lcb=1.2))
        assert reader.lookup("p", fp).id == a  # the memoized "no kernel" was dropped
        b = writer.add_kernel(make_record("p", "b", fp, speedup_lcb=1.9))
        assert reader.lookup("p", fp).id == b
        writer.set_status(b, QUARANTINED)
        assert reader.lookup("p", fp).id == a
        n = len(calls)
        assert reader.lookup("p", fp).id == a and len(calls) == n
        # A write that bypasses kernelsmith altogether still moves the counter (the trigger).
        with psycopg.connect(autocommit=True, **_connect_kwargs(postgres_url)) as conn:
            conn.execute("UPDATE kernels SET status = 'rejected' WHERE id = %s", (a,))
        assert reader.lookup("p", fp) is None
        # A database dropped and made again under the same URL starts a new epoch, not a count from zero.
        with psycopg.connect(autocommit=True, **_connect_kwargs(postgres_url)) as conn:
            conn.execute("UPDATE kernel_cache_generation SET epoch = 'other', gen = 0")
            conn.execute("ALTER TABLE kernels DISABLE TRIGGER kernels_generation")
            conn.execute("UPDATE kernels SET status = 'verified' WHERE id = %s", (a,))
        assert reader.lookup("p", fp).id == a
    with KernelStore(postgres_url, memo=False) as plain:
        assert plain.lookup("p", fp).id == a


def test_a_server_restart_costs_a_reconnection_not_an_error(postgres_cluster):
    url = postgres_cluster.create_database()
    fp = h200()
    with KernelStore(url) as s:
        kid = s.add_kernel(make_record("p", "a", fp))
        assert s.lookup("p", fp).id == kid
        postgres_cluster.restart()
        assert s.lookup("p", fp).id == kid  # the reader's connection, made again
        assert s.add_kernel(make_record("p", "b", fp, speedup_lcb=2.0)) != kid  # the pool's, checked and made again
        assert s.lookup("p", fp).speedup_lcb == 2.0


def test_gc_packs_trajectories_and_cli(tmp_path, postgres_cluster, capsys, monkeypatch):
    from kernel_cache.pack import ExportFilters, export_pack
    from ks_inductor.cli import main
    from ks_inductor.judge.packs import import_pack
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.training import export_trajectories

    monkeypatch.setenv("COLUMNS", "250")
    problem = load_problem(ROOT / "tests" / "problems" / "rmsnorm.py")
    fp = h200()
    src_url, dest_url = postgres_cluster.create_database(), postgres_cluster.create_database()
    with KernelStore(src_url) as src:
        src.upsert_problem(problem)
        ids = [src.add_kernel(make_record(problem.key, f"v{i}", fp, speedup_lcb=1.0 + i / 10)) for i in range(4)]
        rejected = src.add_kernel(make_record(problem.key, "bad", fp, status=REJECTED))
        assert src.lookup(problem.key, fp).id == ids[-1]
        assert {r.id for r in src.gc_plan(keep=2)} == {ids[0], ids[1], rejected}

        pack = tmp_path / "pg.kspack"
        assert export_pack(src, pack, vectors=False).kernels == 4
        with KernelStore(dest_url) as dest:
            res = import_pack(pack, dest, fingerprint=fp)
            assert (res.added, res.kept, res.problems) == (4, 0, 1)
            assert dest.lookup(problem.key, fp).sha256 == src.lookup(problem.key, fp).sha256
            again = import_pack(pack, dest, fingerprint=fp)
            assert (again.added, again.kept) == (0, 4)

        run = src.start_run(problem.key, fp, {})
        parent, child = "def f():\n    return 1\n", "def f():\n    return 2\n"
        src.add_step(StepRecord(run_id=run, problem_key=problem.key, child_id="c", mutation="param", parent_id="p",
                                verdict="accepted", correct=True, parent_speedup=1.0, child_speedup=1.3,
                                child_speedup_lcb=1.25, noise=0.01, parent_source=parent, child_source=child,
                                fingerprint=fp.to_json()))
        stats = export_trajectories(src, "sft", tmp_path / "sft.jsonl")
        row = json.loads((tmp_path / "sft.jsonl").read_text())
        assert stats.rows == 1 and row["problem_key"] == problem.key and row["hardware"]["device_name"] == "NVIDIA H200"

    def run_cli(*argv):
        code = main(list(argv))
        return code, capsys.readouterr()

    empty = postgres_cluster.create_database()
    code, out = run_cli("cache", "ls", "--db", empty)
    assert code == 0 and "no kernel cache" in out.err  # a command that only reads creates no schema
    with psycopg.connect(**_connect_kwargs(empty)) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
    code, out = run_cli("cache", "gc", "--db", src_url, "--keep", "2", "--json")
    assert code == 0 and len(json.loads(out.out)["deleted"]) == 3, out.err
    code, out = run_cli("cache", "stats", "--db", src_url, "--json")
    assert code == 0 and json.loads(out.out)["kernels_by_status"] == {"verified": 2}
    code, out = run_cli("pack", "export", "--db", src_url, "-o", str(tmp_path / "cli.kspack"), "--json")
    assert code == 0 and json.loads(out.out)["kernels"] == 2, out.err
    code, out = run_cli("pack", "import", str(tmp_path / "cli.kspack"), "--db", dest_url, "--json",
                        "--no-fingerprint-check")
    assert code == 0 and json.loads(out.out)["kept"] == 2, out.err
    with KernelStore(dest_url) as dest:
        assert len(dest.kernels(status="verified", problem_key=problem.key)) == 4
        assert export_pack(dest, tmp_path / "x.kspack", ExportFilters(min_speedup=1.15), vectors=False).kernels == 2


def test_export_trajectories_reads_a_team_cache(tmp_path, postgres_url, capsys):
    """The export reads a PostgreSQL cache through the same opening as every command: the rows name the hardware
    from the stored steps and verdicts, and the drop reasons add up to the steps read."""
    from ks_inductor.cli import main
    from tests.trajectories import H100, timed_cache

    with KernelStore(postgres_url) as store:
        timed_cache(store)
        read = len(store.steps())
    out = tmp_path / "pg.jsonl"
    assert main(["export-trajectories", "--db", postgres_url, "-o", str(out), "--format", "rl", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert got["rows"] == len(rows) == 3 and got["steps"] == read
    assert got["kept"] + sum(got["dropped"].values()) == read and got["dropped"]["no_hardware"] == 1
    assert {r["extra_info"]["hardware"]["fingerprint_id"] for r in rows} == {H100.id}
    card = Path(got["card"]).read_text()
    assert "3 rl rows" in card and f"{read} steps read, 3 kept" in card and "export-trajectories --format rl" in card


def test_unreachable_server_is_one_actionable_line_never_corrupt(capsys):
    if psycopg is None:
        unavailable("psycopg is not installed; pip install 'kernelsmith[postgres]'")
    url = "postgresql://kernelsmith:secret@127.0.0.1:1/kernels"
    with pytest.raises(DatabaseUnavailableError) as err:
        KernelStore(url)
    msg = str(err.value)
    assert not isinstance(err.value, CorruptDatabaseError) and "corrupt" not in msg.lower()
    assert "\n" not in msg and "cannot connect to PostgreSQL" in msg and "server is running" in msg
    assert "secret" not in msg  # the password stays out of messages
    from ks_inductor.cli import main

    assert main(["cache", "ls", "--db", url]) != 0
    err_out = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err_out and "corrupt" not in err_out.lower()


def test_fast_reader_connects_where_sqlalchemy_does():
    if psycopg is None:
        unavailable("psycopg is not installed; pip install 'kernelsmith[postgres]'")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from kernel_cache.postgres import conninfo
    from kernel_cache.urls import display_url, normalize_url

    for url in ("postgresql+psycopg://u:p%40ss@/db?host=/tmp/Sock", "postgresql://u:pw@Db.example:6543/kern%20els",
                "postgres://u@[::1]:5433/d?sslmode=require", "postgresql://%2Ftmp%2Fpg/db"):
        url = normalize_url(url)
        want = create_engine(url).dialect.create_connect_args(make_url(url))[1]
        want.pop("context", None)
        got = {k: v for k, v in conninfo(url).items() if k in want}
        assert got == {k: int(v) if k == "port" else v for k, v in want.items()}, url
        assert "pw" not in display_url(url) and "p%40ss" not in display_url(url)


def test_server_errors_are_not_reported_as_corruption(postgres_url):
    with KernelStore(postgres_url) as s:
        with psycopg.connect(autocommit=True, **_connect_kwargs(postgres_url)) as conn:
            conn.execute("DROP TABLE misses")
        with pytest.raises(CacheError) as err:
            s.misses()
        assert not isinstance(err.value, CorruptDatabaseError) and "misses" in str(err.value)


def test_backend_serves_a_hit_from_postgres(postgres_url):
    import warnings

    import torch
    import torch.nn as nn

    from kernel_cache.record import KernelRecord
    from ks_inductor.compiler import backend as B
    from ks_inductor.compiler.explain import explain

    class Tiny(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.w = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w

    from tests.cached_kernels import norm_kernel_module, recorded_plan

    kernel = norm_kernel_module()
    torch.manual_seed(0)
    m, x = Tiny().eval(), torch.randn(4, 16)
    torch._dynamo.reset()
    B.clear_reports()
    try:
        (norm,) = [r for r in explain(m, x, db=postgres_url).regions if r.kind == "norm"]
        with KernelStore(postgres_url) as s:
            s.add_kernel(KernelRecord(problem_key=norm.key, source=kernel, backend="triton-interpret",
                                      fingerprint=B.current_fingerprint().to_json(), timed=False,
                                      plan=recorded_plan(kernel, [x, m.w.detach()])))
        B.forget_stores()
        compiled = torch.compile(m, backend="kernelsmith", options={"kernelsmith.db": postgres_url,
                                                                    "compile_threads": 1})
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-5)
        assert B.compile_reports()[-1].swapped == 1
        assert B.shared_store(postgres_url).fast  # served by psycopg alone, without SQLAlchemy's store
    finally:
        B.forget_stores()
        torch._dynamo.reset()
