"""Database files: refusing corrupt, foreign and newer ones untouched; migrating the first schema forward."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time

import pytest
from sqlalchemy import create_engine, inspect

from kernel_cache.errors import CacheError, CorruptDatabaseError, SchemaTooNewError
from kernel_cache.migrations import CURRENT_VERSION, SCHEMA_V1
from kernel_cache.record import source_sha256
from kernel_cache.store import KernelStore
from kernel_cache.testing import a100, h200, kernel_source, make_record


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_garbage_file_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "kernels.db"
    db.write_bytes(b"this is a text file, not a database\n" * 100)
    before = _digest(db)
    with pytest.raises(CorruptDatabaseError, match="not a SQLite database.*untouched"):
        KernelStore(str(db))
    assert _digest(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["kernels.db"]


def test_damaged_sqlite_file_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "kernels.db"
    with KernelStore(str(db)) as s:
        s.add_kernel(make_record("p", "a"))
    raw = bytearray(db.read_bytes())
    raw[100:4096] = b"\xff" * (4096 - 100)  # page 1 after the header: the schema table itself
    db.write_bytes(bytes(raw))
    for side in ("-wal", "-shm"):
        (tmp_path / f"kernels.db{side}").unlink(missing_ok=True)
    before = _digest(db)
    with pytest.raises(CorruptDatabaseError, match="untouched|corrupt"):
        KernelStore(str(db))
    assert _digest(db) == before


def test_newer_schema_is_refused_untouched(tmp_path):
    db = tmp_path / "kernels.db"
    with KernelStore(str(db)) as s:
        s.add_kernel(make_record("p", "a"))
    c = sqlite3.connect(db)
    c.execute("UPDATE schema_version SET version = ?", (CURRENT_VERSION + 1,))
    c.commit()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    before = _digest(db)
    with pytest.raises(SchemaTooNewError, match=rf"version {CURRENT_VERSION + 1}.*newer kernelsmith.*Upgrade"):
        KernelStore(str(db))
    assert _digest(db) == before


def test_foreign_database_is_refused(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(CacheError, match="not a kernelsmith database"):
        KernelStore(str(db))


def _schema(url: str) -> dict[str, tuple[set[str], set[str]]]:
    eng = create_engine(url)
    insp = inspect(eng)
    out = {t: ({c["name"] for c in insp.get_columns(t)}, {i["name"] for i in insp.get_indexes(t)})
           for t in insp.get_table_names()}
    eng.dispose()
    return out


def test_migration_from_the_first_schema(tmp_path):
    db = tmp_path / "v1.db"
    now = time.time()
    fast, slow, old_sw = h200(), h200(), h200(torch_version="2.10.0", triton_version="3.5.0")
    with sqlite3.connect(db) as c:
        for ddl in SCHEMA_V1:
            c.execute(ddl)
        c.execute("INSERT INTO schema_version VALUES (1, 1, 'kernelsmith 0.0.1', ?)", (now,))
        rows = [("a", fast, 1.8, None), ("b", slow, None, 1.3), ("c", a100(), 3.0, None), ("d", old_sw, 5.0, None)]
        for tag, fp, lcb, ind in rows:
            src = kernel_source(tag)
            c.execute(
                "INSERT INTO kernels (problem_key, source, sha256, launch_params, backend, fingerprint, fingerprint_id,"
                " status, speedup_lcb, speedup_inductor, median_ms, trials, timed, created_at) "
                "VALUES ('p', ?, ?, '{}', 'cuda', ?, ?, 'verified', ?, ?, 1.0, 5, 1, ?)",
                (src, source_sha256(src), json.dumps(fp.to_json()), fp.id, lcb, ind, now))
        c.execute("INSERT INTO runs (id, problem_key, fingerprint, fingerprint_id, config, status, started_at, "
                  "updated_at) VALUES ('r1', 'p', ?, ?, '{}', 'running', ?, ?)",
                  (json.dumps(fast.to_json()), fast.id, now, now))
    with KernelStore(str(db)) as s:
        assert s.schema_version == CURRENT_VERSION
        best = s.lookup("p", fast)
        assert best.source == kernel_source("a")  # rank backfilled from the lcb; a100 and old-software rows out
        assert best.plan == ""  # stored before judged plans were kept: it serves from its forward
        assert best.speedup_graph is None  # nor its figure inside a CUDA graph
        assert {r.source for r, _ in s.lookup_candidates("p", fast)} == {kernel_source(t) for t in "abd"}
        assert s.latest_run("p", fast) == "r1"
        assert s.misses() == []  # the misses table exists now
        assert s.add_kernel(make_record("p", "new", fast, speedup_lcb=2.5, plan='{"version": 1}',
                                        speedup_graph=0.98)) > 0
        assert s.lookup("p", fast).source == kernel_source("new")
        assert s.lookup("p", fast).plan == '{"version": 1}'
        assert s.lookup("p", fast).speedup_graph == 0.98
        assert [k.speedup_graph for k in s.kernels("p") if k.source == kernel_source("new")] == [0.98]
        assert [k.plan for k in s.kernels("p") if k.source == kernel_source("new")] == ['{"version": 1}']
    fresh = tmp_path / "fresh.db"
    KernelStore(str(fresh)).close()
    assert _schema(f"sqlite:///{db}") == _schema(f"sqlite:///{fresh}")
    with KernelStore(str(db)) as again:  # reopening a migrated database is a no-op
        assert again.schema_version == CURRENT_VERSION
