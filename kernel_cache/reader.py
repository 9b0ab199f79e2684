"""The reads a compile makes, on a SQLite kernel cache, with the ``sqlite3`` driver alone.

A compile that hits the cache only looks kernels up (and reads graph guard decisions). Importing SQLAlchemy and
declaring the models for that costs more than everything else the backend does on such a compile (about 0.4 s
per process on a 2-core CPU), so :func:`open_fast` opens a SQLite file already at the current schema version
with the driver only; :class:`kernel_cache.store.KernelStore` uses the same reader for its own lookups, so
there is one lookup and one memo. Anything else (a missing, older, newer or damaged file, another database
engine, and every write) goes through ``KernelStore``, which creates, migrates or refuses as it always has.
A PostgreSQL cache gets the same treatment from :class:`kernel_cache.postgres.PgReader` (psycopg alone).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from kernel_cache.errors import CacheError, CorruptDatabaseError
from kernel_cache.fingerprint import BACKEND_CPU_INTERPRET, MATCH_EXACT, MATCH_NONE, EnvFingerprint, match
from kernel_cache.record import VERIFIED, KernelRecord

log = logging.getLogger(__name__)

# The schema version this code reads and writes (kernel_cache.migrations.CURRENT_VERSION is this).
SCHEMA_VERSION = 2
SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_FIELDS = [f.name for f in fields(KernelRecord)]
LOOKUP_SQL = (
    f"SELECT {', '.join(KERNEL_FIELDS)} FROM kernels WHERE problem_key = ? AND status = ? AND hardware_id = ? "
    "ORDER BY rank_speedup IS NULL, rank_speedup DESC, median_ms IS NULL, median_ms, id"
)
GUARD_TABLE = "graph_guard_decisions"


def servable(rec: KernelRecord, fp: EnvFingerprint, current: EnvFingerprint) -> str:
    """The match verdict, with the interpreter rule on top: an untimed kernel is only for cpu-interpret."""
    if not rec.timed and current.backend != BACKEND_CPU_INTERPRET:
        return MATCH_NONE
    return match(fp, current)


def sqlite_file(url: str) -> Path | None:
    """The file behind a plain path or a ``sqlite:///`` URL without options; None for anything else (in-memory,
    ``file:`` URIs, query strings, other engines): those are left to SQLAlchemy's parser."""
    if "://" not in url:
        return Path(url).expanduser().resolve()
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url:
        return None
    rest = url[len(prefix):]
    if not rest or rest == ":memory:" or rest.startswith("file:"):
        return None
    return Path(rest)


class SqliteReader:
    """Kernel lookups and guard decisions on one SQLite file, with a per-process memo in front of lookups that is
    dropped whenever ``PRAGMA data_version`` says any connection (this process or another) committed."""

    def __init__(self, path: Path, where: str | None = None) -> None:
        self.path = path
        self.where = where or str(path)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, EnvFingerprint], KernelRecord | None] = {}
        self._stamp_conn: sqlite3.Connection | None = None
        self._stamp: int | None = None

    def close(self) -> None:
        with self._lock:
            if self._stamp_conn is not None:
                self._stamp_conn.close()
                self._stamp_conn = None
            for conn in self._readers:
                conn.close()
            self._readers.clear()
            self._memo.clear()

    def invalidate(self) -> None:
        with self._lock:
            self._memo.clear()

    def _data_version(self) -> int:
        # A connection of its own: data_version changes when *other* connections commit, pooled ones included.
        if self._stamp_conn is None:
            self._stamp_conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                               check_same_thread=False)
        return int(self._stamp_conn.execute("PRAGMA data_version").fetchone()[0])

    def connection(self) -> sqlite3.Connection:
        """This thread's read-only driver connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = 1")
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    def schema_version(self) -> int | None:
        row = self.connection().execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def lookup(self, problem_key: str, fingerprint: EnvFingerprint, memo: bool = True) -> KernelRecord | None:
        """The best verified kernel for ``problem_key`` that may serve on ``fingerprint`` unverified again."""
        try:
            if not memo:
                return self._lookup_db(problem_key, fingerprint)
            memo_key = (problem_key, fingerprint)  # the frozen dataclass hashes faster than its .id
            with self._lock:
                stamp = self._data_version()
                if stamp != self._stamp:
                    self._memo.clear()
                    self._stamp = stamp
                if memo_key in self._memo:
                    return self._memo[memo_key]
            rec = self._lookup_db(problem_key, fingerprint)
            with self._lock:
                if self._stamp == stamp:
                    self._memo[memo_key] = rec
            return rec
        except sqlite3.DatabaseError as e:
            raise _cache_error(self.where, e) from None

    def _lookup_db(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None:
        cur = self.connection().execute(LOOKUP_SQL, (problem_key, VERIFIED, fingerprint.hardware_id))
        for row in cur:
            data = dict(zip(KERNEL_FIELDS, row))
            data["fingerprint"] = fp_json = json.loads(data["fingerprint"])
            data["launch_params"] = json.loads(data["launch_params"]) if data["launch_params"] else {}
            data["timed"] = bool(data["timed"])
            rec = KernelRecord(**data)
            if servable(rec, EnvFingerprint.from_json(fp_json), fingerprint) == MATCH_EXACT:
                cur.close()
                return rec
        return None

    def guard_decision(self, key: str) -> dict[str, Any] | None:
        """A stored graph guard result for ``key``; None when there is none (or no table yet)."""
        try:
            row = self.connection().execute(f"SELECT result FROM {GUARD_TABLE} WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return None
            raise _cache_error(self.where, e) from None
        except sqlite3.DatabaseError as e:
            raise _cache_error(self.where, e) from None
        return decode_guard_result(row[0]) if row is not None else None


def decode_guard_result(value: Any) -> dict[str, Any] | None:
    """A stored graph guard result column as a dict; None for anything else."""
    data = json.loads(value) if isinstance(value, str) else value
    return data if isinstance(data, dict) else None


def _cache_error(where: str, e: sqlite3.Error) -> CacheError:
    msg = str(e)
    if isinstance(e, sqlite3.OperationalError) and "malformed" not in msg and "not a database" not in msg:
        return CacheError(f"{where}: {msg}")
    return CorruptDatabaseError(f"{where} cannot be read ({msg}); it was left untouched")


def open_fast(url: str | None) -> Any:
    """A reader for ``url`` when it is a SQLite file (or a PostgreSQL database through psycopg) at
    :data:`SCHEMA_VERSION`; None otherwise (the caller then opens a ``KernelStore``, which creates, migrates or
    refuses the database)."""
    from kernel_cache.db import default_db_url
    from kernel_cache.postgres import is_postgres_url, normalize_url

    url = url or default_db_url()
    if is_postgres_url(url):
        from kernel_cache.postgres import open_fast as open_postgres

        url = normalize_url(url)
        return open_postgres(url) if url.startswith("postgresql+psycopg://") else None
    path = sqlite_file(url)
    if path is None or not path.is_file():
        return None
    reader = None
    try:
        with open(path, "rb") as f:
            if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                return None
        reader = SqliteReader(path)
        if reader.schema_version() == SCHEMA_VERSION:
            return reader
    except (OSError, sqlite3.Error, ValueError) as e:
        log.debug("no fast reader for %s: %s", path, e)
    if reader is not None:
        reader.close()
    return None


class LazyKernelStore:
    """What the backend holds for a database: lookups and guard decisions through :class:`SqliteReader` (or
    :class:`kernel_cache.postgres.PgReader`) when the database allows it; a
    :class:`kernel_cache.store.KernelStore` (and SQLAlchemy) only when something else is asked for, such as
    recording a miss or storing a decision."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._store: Any = None
        self._reader = open_fast(url)
        if self._reader is None:
            self._full()

    def _full(self) -> Any:
        if self._store is None:
            from kernel_cache.store import KernelStore

            self._store = KernelStore(self.url)
        return self._store

    @property
    def fast(self) -> bool:
        """Whether reads go through the driver alone (nothing has needed SQLAlchemy yet)."""
        return self._store is None

    def lookup(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None:
        if self._store is not None:
            return self._store.lookup(problem_key, fingerprint)
        assert self._reader is not None
        return self._reader.lookup(problem_key, fingerprint)

    def guard_decision(self, key: str) -> dict[str, Any] | None:
        if self._store is not None:
            return self._store.guard_decision(key)
        assert self._reader is not None
        return self._reader.guard_decision(key)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._store is not None:
            self._store.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._full(), name)
