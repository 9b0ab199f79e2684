"""Schema versions and migrations.

The database records its schema version in ``schema_version``. A fresh database gets the current schema from
:mod:`kernel_cache.models`; an older one is brought forward by the ordered steps in ``MIGRATIONS``, one
transaction per step; a newer one is refused, untouched. Each step is frozen once released: it describes the
change from its own version, not from whatever the models say today.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, ProgrammingError

from kernel_cache import postgres as pg
from kernel_cache.errors import CacheError, CorruptDatabaseError, NoDatabaseError, SchemaTooNewError
from kernel_cache.models import Base
from kernel_cache.schema import SCHEMA_VERSION
from ks_core.fingerprint import EnvFingerprint, minor_version
from ks_core.version import __version__

log = logging.getLogger(__name__)

CURRENT_VERSION = SCHEMA_VERSION  # kept in kernel_cache.schema, which the driver-only readers also read

# The first schema, as it shipped (SQLite). Kept verbatim: it is what a v1 database looks like on disk.
SCHEMA_V1 = [
    """CREATE TABLE schema_version (
        id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL, written_by VARCHAR(64), updated_at FLOAT NOT NULL)""",
    """CREATE TABLE problems (
        "key" VARCHAR(128) NOT NULL PRIMARY KEY, name VARCHAR(256), source TEXT NOT NULL, op_summary JSON,
        signature TEXT, problem_json JSON NOT NULL, created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL)""",
    """CREATE TABLE kernels (
        id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, problem_key VARCHAR(128) NOT NULL, source TEXT NOT NULL,
        sha256 VARCHAR(64) NOT NULL, launch_params JSON, backend VARCHAR(32) NOT NULL, fingerprint JSON NOT NULL,
        fingerprint_id VARCHAR(32) NOT NULL, status VARCHAR(16) NOT NULL, op_family VARCHAR(64), median_ms FLOAT,
        eager_ms FLOAT, inductor_ms FLOAT, speedup_eager FLOAT, speedup_inductor FLOAT, speedup_lcb FLOAT,
        trials INTEGER, timed BOOLEAN, run_id VARCHAR(64), parent_id VARCHAR(64), candidate_id VARCHAR(64),
        created_at FLOAT NOT NULL,
        CONSTRAINT uq_kernels_identity UNIQUE (problem_key, sha256, fingerprint_id))""",
    "CREATE INDEX ix_kernels_key_status ON kernels (problem_key, status)",
    "CREATE INDEX ix_kernels_family ON kernels (op_family)",
    """CREATE TABLE runs (
        id VARCHAR(64) NOT NULL PRIMARY KEY, problem_key VARCHAR(128) NOT NULL, fingerprint JSON NOT NULL,
        fingerprint_id VARCHAR(32) NOT NULL, config JSON, state JSON, summary JSON, status VARCHAR(16) NOT NULL,
        started_at FLOAT NOT NULL, updated_at FLOAT NOT NULL, finished_at FLOAT)""",
    "CREATE INDEX ix_runs_problem ON runs (problem_key, fingerprint_id, status)",
    """CREATE TABLE evaluations (
        id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, problem_key VARCHAR(128) NOT NULL,
        candidate_hash VARCHAR(64) NOT NULL, fingerprint_id VARCHAR(32) NOT NULL,
        run_id VARCHAR(64) REFERENCES runs (id) ON DELETE SET NULL, verdict VARCHAR(16) NOT NULL, correct BOOLEAN,
        stage VARCHAR(16), median_ms FLOAT, speedup_eager FLOAT, speedup_inductor FLOAT, result JSON NOT NULL,
        created_at FLOAT NOT NULL)""",
    "CREATE INDEX ix_evaluations_lookup ON evaluations (problem_key, candidate_hash, fingerprint_id)",
    """CREATE TABLE evolution_steps (
        id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, run_id VARCHAR(64) NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        problem_key VARCHAR(128) NOT NULL, parent_id VARCHAR(64), child_id VARCHAR(64) NOT NULL,
        mutation VARCHAR(32) NOT NULL, diff TEXT, prompt TEXT, response TEXT, verdict VARCHAR(16), correct BOOLEAN,
        speedup_delta FLOAT, feedback TEXT, detail JSON, created_at FLOAT NOT NULL)""",
    "CREATE INDEX ix_steps_run ON evolution_steps (run_id)",
    "CREATE INDEX ix_steps_problem ON evolution_steps (problem_key)",
]


def _v1_to_v2(conn: Connection) -> None:
    """v2: fingerprint parts in indexed columns (hardware id, torch/triton minors) and a stored rank, so that
    lookup is one index range scan; and the misses table."""
    for ddl in (
        "ALTER TABLE kernels ADD COLUMN hardware_id VARCHAR(32) NOT NULL DEFAULT ''",
        "ALTER TABLE kernels ADD COLUMN torch_minor VARCHAR(16) NOT NULL DEFAULT ''",
        "ALTER TABLE kernels ADD COLUMN triton_minor VARCHAR(16) NOT NULL DEFAULT ''",
        "ALTER TABLE kernels ADD COLUMN rank_speedup FLOAT",
        "ALTER TABLE kernels ADD COLUMN updated_at FLOAT NOT NULL DEFAULT 0",
    ):
        conn.execute(text(ddl))
    rows = conn.execute(text(
        "SELECT id, fingerprint, speedup_lcb, speedup_inductor, speedup_eager, created_at FROM kernels")).all()
    for kid, fp_raw, lcb, ind, eag, created in rows:
        fp = EnvFingerprint.from_json(json.loads(fp_raw) if isinstance(fp_raw, str) else fp_raw)
        conn.execute(
            text("UPDATE kernels SET hardware_id=:h, torch_minor=:t, triton_minor=:tr, rank_speedup=:r, "
                 "updated_at=:u WHERE id=:id"),
            {"h": fp.hardware_id, "t": minor_version(fp.torch_version), "tr": minor_version(fp.triton_version),
             "r": rank_of(lcb, ind, eag), "u": created, "id": kid},
        )
    conn.execute(text("DROP INDEX ix_kernels_key_status"))
    conn.execute(text(
        "CREATE INDEX ix_kernels_lookup ON kernels (problem_key, status, hardware_id, rank_speedup)"))
    conn.execute(text(
        """CREATE TABLE misses (
            problem_key VARCHAR(128) NOT NULL PRIMARY KEY, count INTEGER, signature TEXT, shapes JSON,
            problem_json JSON NOT NULL, fingerprint JSON NOT NULL, first_seen FLOAT NOT NULL,
            last_seen FLOAT NOT NULL)"""))


def _v2_to_v3(conn: Connection) -> None:
    """v3: each kernel's judged launch plan, which serving launches at the judged signature (empty for kernels
    stored before: they keep recording their own)."""
    conn.execute(text("ALTER TABLE kernels ADD COLUMN plan TEXT"))


def _v3_to_v4(conn: Connection) -> None:
    """v4: each kernel's speedup inside a CUDA graph beside its per-call figures (NULL for kernels stored before)."""
    conn.execute(text("ALTER TABLE kernels ADD COLUMN speedup_graph FLOAT"))


# MIGRATIONS[v] brings a database from version v to v + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}


def rank_of(lcb: float | None, inductor: float | None, eager: float | None) -> float | None:
    for v in (lcb, inductor, eager):
        if v is not None:
            return float(v)
    return None


def _read_version(conn: Connection) -> int | None:
    """The stored version; None for an empty database. Raises for a database that is not ours."""
    names = set(inspect(conn).get_table_names())
    if not names:
        return None
    if "schema_version" not in names:
        raise CacheError(
            f"the database has tables ({', '.join(sorted(names)[:5])}) but no schema_version: it is not a "
            "kernelsmith database; pass another --db"
        )
    v = conn.execute(text("SELECT version FROM schema_version WHERE id = 1")).scalar()
    if v is None:
        raise CorruptDatabaseError("schema_version is empty; the database was damaged. It was left untouched.")
    return int(v)


def _stamp(conn: Connection, version: int) -> None:
    now = time.time()
    updated = conn.execute(
        text("UPDATE schema_version SET version=:v, written_by=:w, updated_at=:t WHERE id=1"),
        {"v": version, "w": f"kernelsmith {__version__}", "t": now},
    ).rowcount
    if not updated:
        conn.execute(text("INSERT INTO schema_version (id, version, written_by, updated_at) VALUES (1, :v, :w, :t)"),
                     {"v": version, "w": f"kernelsmith {__version__}", "t": now})


def _refuse_newer(version: int, where: str) -> None:
    if version > CURRENT_VERSION:
        raise SchemaTooNewError(
            f"{where} has schema version {version}, written by a newer kernelsmith; this one understands up to "
            f"version {CURRENT_VERSION}. Upgrade kernelsmith (pip install -U kernelsmith) or use another --db. "
            "The database was not modified."
        )


def ensure_schema(read_engine: Engine, write_engine: Engine, where: str = "the database", create: bool = True) -> int:
    """Create or migrate the schema as needed; return the version now in place. ``create=False``: an empty
    database raises :class:`NoDatabaseError` and stays empty.

    A database already at the current version is only read. Work that writes happens inside a transaction that
    holds the database's write lock (SQLite's BEGIN IMMEDIATE; on PostgreSQL the advisory lock
    :data:`kernel_cache.postgres.SCHEMA_LOCK`) and re-checks the version there, so processes opening one
    database at once create or migrate it exactly once, and the others find the work done. A rival that took no
    lock (an older kernelsmith) can still win a race for a CREATE: its "already exists" is taken as the schema
    being made, and the version is read again.
    """
    postgres = write_engine.dialect.name == "postgresql"
    try:
        for attempt in range(3):
            try:
                return _ensure_schema(read_engine, write_engine, where, postgres, create)
            except (ProgrammingError, IntegrityError) as e:
                if not postgres or pg.sqlstate(e) not in pg.ALREADY_EXISTS_SQLSTATES or attempt == 2:
                    raise
                log.info("%s: another process created the schema first (%s); reading it again", where,
                         pg.sqlstate(e))
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")
    except OperationalError as e:
        msg = str(e.orig) if e.orig is not None else str(e)
        if postgres:
            raise pg.connect_error(where, e.orig if e.orig is not None else e) from None
        if "unable to open" in msg or "readonly" in msg:
            raise CacheError(f"cannot open {where}: {msg}") from None
        if "not a database" in msg or "malformed" in msg:
            raise CorruptDatabaseError(f"{where} is corrupt ({msg}); it was left untouched") from None
        raise
    except DatabaseError as e:
        msg = str(e.orig) if e.orig is not None else str(e)
        if write_engine.dialect.name != "sqlite":
            # A server's error (permissions, a missing extension, a constraint) is not damage to a file.
            first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
            raise CacheError(f"cannot set up the kernel cache schema in {where}: {first}") from None
        raise CorruptDatabaseError(
            f"{where} cannot be read ({msg}); it was left untouched. Move it aside or pass another --db."
        ) from None


def _lock_schema(conn: Connection, postgres: bool) -> None:
    if postgres:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": pg.SCHEMA_LOCK})


def _has_extras(conn: Connection, postgres: bool) -> bool:
    return not postgres or pg.has_extras(conn)


def _ensure_schema(read_engine: Engine, write_engine: Engine, where: str, postgres: bool, create: bool) -> int:
    with read_engine.connect() as conn:
        version = _read_version(conn)
        extras = version is None or _has_extras(conn, postgres)
    if version is None and not create:
        raise NoDatabaseError(where)
    if version is not None:
        _refuse_newer(version, where)
        if version == CURRENT_VERSION and extras:
            return version
    with write_engine.begin() as conn:
        _lock_schema(conn, postgres)
        version = _read_version(conn)
        if version is None:
            Base.metadata.create_all(conn)
            _stamp(conn, CURRENT_VERSION)
            if postgres:
                pg.ensure_extras(conn)
            log.info("created kernel cache schema v%d in %s", CURRENT_VERSION, where)
            return CURRENT_VERSION
        _refuse_newer(version, where)
        if not _has_extras(conn, postgres):
            pg.ensure_extras(conn)
    while version < CURRENT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise CacheError(f"no migration from schema version {version}; {where} cannot be upgraded")
        with write_engine.begin() as conn:
            _lock_schema(conn, postgres)
            now = _read_version(conn)
            if now == version:  # not migrated meanwhile by another process
                step(conn)
                _stamp(conn, version + 1)
                log.info("migrated %s from schema v%d to v%d", where, version, version + 1)
                now = version + 1
        version = int(now or version + 1)
    return version
