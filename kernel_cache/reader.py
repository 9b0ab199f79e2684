"""The reads a compile makes, through a database driver alone: kernel lookups and graph guard decisions.

A compile that hits the cache only looks kernels up (and reads graph guard decisions). Importing SQLAlchemy and
declaring the models for that costs more than everything else the backend does on such a compile (about 0.4 s
per process on a 2-core CPU), so :func:`open_reader` opens a database already at the current schema version with
its driver only: ``sqlite3`` for a SQLite file (:class:`SqliteReader`), psycopg for PostgreSQL
(:class:`PgReader`). Both are one :class:`KernelReader`: the same lookup, the same row decoding and the same
per-process memo, dropped whenever the database's stamp moves (SQLite's ``PRAGMA data_version``, PostgreSQL's
generation counter), so a memo never serves a stale answer. :class:`kernel_cache.store.KernelStore` uses the same
readers for its own lookups, so there is one lookup and one memo. Anything else (a missing, older, newer or
damaged database, another database engine, and every write) goes through ``KernelStore``, which creates,
migrates or refuses as it always has.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from kernel_cache.errors import CacheError, CorruptDatabaseError
from kernel_cache.postgres import STAMP_SQL, connect_error, conninfo
from kernel_cache.record import VERIFIED, KernelRecord
from kernel_cache.schema import (
    GUARD_TABLE,
    KERNEL_FIELDS,
    PLANLESS_LAST,
    ROOM_TABLE,
    SCHEMA_VERSION,
    SQLITE_MAGIC,
    room_key,
)
from kernel_cache.urls import CacheURL, display_url
from ks_core.fingerprint import BACKEND_CPU_INTERPRET, MATCH_EXACT, MATCH_NONE, EnvFingerprint, match

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_SELECT = f"SELECT {', '.join(KERNEL_FIELDS)} FROM kernels"
_VERSION_SQL = "SELECT version FROM schema_version WHERE id = 1"


def servable(rec: KernelRecord, fp: EnvFingerprint, current: EnvFingerprint) -> str:
    """The match verdict, with the interpreter rule on top: an untimed kernel is only for cpu-interpret."""
    if not rec.timed and current.backend != BACKEND_CPU_INTERPRET:
        return MATCH_NONE
    return match(fp, current)


def decode_side_result(value: Any) -> dict[str, Any] | None:
    """A stored JSON result column (a guard decision, a room) as a dict; None for anything else."""
    data = json.loads(value) if isinstance(value, str) else value
    return data if isinstance(data, dict) else None


def _json(value: Any) -> Any:
    # SQLite hands JSON columns back as text; psycopg has already parsed them.
    return json.loads(value) if isinstance(value, str) else value


def record_of(row: Any) -> KernelRecord:
    """A kernels row, in :data:`KERNEL_FIELDS` order, as a KernelRecord."""
    data = dict(zip(KERNEL_FIELDS, row))
    data["fingerprint"] = _json(data["fingerprint"])
    data["launch_params"] = _json(data["launch_params"]) or {}
    data["timed"] = bool(data["timed"])
    return KernelRecord(**data)


class KernelReader:
    """Kernel lookups and guard decisions through one driver, with a per-process memo in front of lookups.

    A lookup reads the database's stamp first, then the kernels: what the query returns is at least as new as
    the stamp it is filed under, and a changed stamp drops the memo. A driver supplies its connections, its
    stamp, its statements (in its parameter style) and how its errors read (:meth:`_run`)."""

    LOOKUP_SQL = ""
    GUARD_SQL = ""
    ROOM_SQL = ""

    def __init__(self, where: str) -> None:
        self.where = where
        self._local = threading.local()
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, EnvFingerprint], KernelRecord | None] = {}
        self._stamp: Hashable | None = None

    # ------------------------------------------------------------------ what a driver supplies
    def _run(self, fn: Callable[[Any], _T]) -> _T:
        """``fn(connection)`` with this thread's connection, its errors as CacheErrors."""
        raise NotImplementedError

    def _stamp_now(self) -> Hashable | None:
        """A value that changes whenever anyone commits to the database; None where there is none."""
        raise NotImplementedError

    def _kernel_rows(self, conn: Any, problem_key: str, hardware_id: str) -> Any:
        """A cursor over the verified kernels of a key on a hardware id, best first."""
        return conn.execute(self.LOOKUP_SQL, (problem_key, VERIFIED, hardware_id))

    def _side_row(self, conn: Any, sql: str, key: str) -> Any:
        """One row of a table beside the versioned schema (guard decisions, rooms); None where it has none."""
        return conn.execute(sql, (key,)).fetchone()

    def close(self) -> None:
        with self._lock:
            self._memo.clear()
            self._stamp = None

    # ------------------------------------------------------------------ the reads
    def invalidate(self) -> None:
        with self._lock:
            self._memo.clear()

    def schema_version(self) -> int | None:
        row = self._run(lambda c: c.execute(_VERSION_SQL).fetchone())
        return int(row[0]) if row and row[0] is not None else None

    def lookup(self, problem_key: str, fingerprint: EnvFingerprint, memo: bool = True) -> KernelRecord | None:
        """The best verified kernel for ``problem_key`` that may serve on ``fingerprint`` unverified again."""
        if not memo:
            return self._lookup_db(problem_key, fingerprint)
        memo_key = (problem_key, fingerprint)  # the frozen dataclass hashes faster than its .id
        stamp = self._stamp_now()
        with self._lock:
            if stamp != self._stamp:
                self._memo.clear()
                self._stamp = stamp
            elif memo_key in self._memo:
                return self._memo[memo_key]
        rec = self._lookup_db(problem_key, fingerprint)
        with self._lock:
            if self._stamp == stamp and stamp is not None:
                self._memo[memo_key] = rec
        return rec

    def _lookup_db(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None:
        def first(conn: Any) -> KernelRecord | None:
            # Closed on the first match: an unfinished SQLite statement would hold its read snapshot open.
            with contextlib.closing(self._kernel_rows(conn, problem_key, fingerprint.hardware_id)) as cur:
                for row in cur:
                    rec = record_of(row)
                    if servable(rec, EnvFingerprint.from_json(rec.fingerprint), fingerprint) == MATCH_EXACT:
                        return rec
            return None

        return self._run(first)

    def guard_decision(self, key: str) -> dict[str, Any] | None:
        """A stored graph guard result for ``key``; None when there is none (or no table yet)."""
        row = self._run(lambda c: self._side_row(c, self.GUARD_SQL, key))
        return decode_side_result(row[0]) if row is not None else None

    def room(self, problem_key: str, fingerprint_id: str) -> dict[str, Any] | None:
        """The stored room (``Room.to_json()``) of a problem on a machine; None when there is none."""
        row = self._run(lambda c: self._side_row(c, self.ROOM_SQL, room_key(problem_key, fingerprint_id)))
        return decode_side_result(row[0]) if row is not None else None


class SqliteReader(KernelReader):
    """A SQLite file through ``sqlite3``: a read-only connection per thread; the stamp is ``PRAGMA data_version``
    on a connection of its own, which changes when any other connection (this process's or another's) commits."""

    LOOKUP_SQL = (f"{_SELECT} WHERE problem_key = ? AND status = ? AND hardware_id = ? "
                  f"ORDER BY {PLANLESS_LAST}, rank_speedup IS NULL, rank_speedup DESC, median_ms IS NULL, median_ms, id")
    GUARD_SQL = f"SELECT result FROM {GUARD_TABLE} WHERE key = ?"
    ROOM_SQL = f"SELECT result FROM {ROOM_TABLE} WHERE key = ?"

    def __init__(self, path: Path, where: str | None = None) -> None:
        super().__init__(where or str(path))
        self.path = path
        self._readers: list[sqlite3.Connection] = []
        self._stamp_lock = threading.Lock()
        self._stamp_conn: sqlite3.Connection | None = None

    def close(self) -> None:
        with self._stamp_lock:
            if self._stamp_conn is not None:
                self._stamp_conn.close()
                self._stamp_conn = None
        with self._lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        super().close()

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

    def _run(self, fn: Callable[[Any], _T]) -> _T:
        try:
            return fn(self.connection())
        except sqlite3.DatabaseError as e:
            raise _sqlite_error(self.where, e) from None

    def _stamp_now(self) -> int:
        try:
            with self._stamp_lock:
                if self._stamp_conn is None:
                    self._stamp_conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                                       check_same_thread=False)
                return int(self._stamp_conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.DatabaseError as e:
            raise _sqlite_error(self.where, e) from None

    def _side_row(self, conn: sqlite3.Connection, sql: str, key: str) -> Any:
        try:
            return super()._side_row(conn, sql, key)
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):  # made by the first row stored
                return None
            raise


def _sqlite_error(where: str, e: sqlite3.Error) -> CacheError:
    msg = str(e)
    if isinstance(e, sqlite3.OperationalError) and "malformed" not in msg and "not a database" not in msg:
        return CacheError(f"{where}: {msg}")
    return CorruptDatabaseError(f"{where} cannot be read ({msg}); it was left untouched")


class PgReader(KernelReader):
    """A PostgreSQL cache through psycopg: an autocommit connection per thread (each statement sees everything
    committed before it); the stamp is the generation counter (:mod:`kernel_cache.postgres`), so each lookup
    costs one round trip, and a memo miss one more."""

    LOOKUP_SQL = (f"{_SELECT} WHERE problem_key = %s AND status = %s AND hardware_id = %s "
                  f"ORDER BY {PLANLESS_LAST}, rank_speedup DESC NULLS LAST, median_ms ASC NULLS LAST, id")
    GUARD_SQL = f"SELECT result FROM {GUARD_TABLE} WHERE key = %s"
    ROOM_SQL = f"SELECT result FROM {ROOM_TABLE} WHERE key = %s"

    def __init__(self, url: str, where: str | None = None) -> None:
        super().__init__(where or display_url(url))
        self.url = url
        self._kw = conninfo(url)
        self._conns: list[Any] = []

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - a dead connection has nothing left to close
                    pass
            self._conns.clear()
        self._local = threading.local()
        super().close()

    def connection(self) -> Any:
        """This thread's autocommit connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg  # the postgres extra: a SQLite user need not have it

            try:
                conn = psycopg.connect(autocommit=True, **self._kw)
            except psycopg.OperationalError as e:
                raise connect_error(self.where, e) from None
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _run(self, fn: Callable[[Any], _T]) -> _T:
        """``fn(conn)``, once more on a fresh connection if the server dropped this one (a restart, a failover)."""
        import psycopg

        for attempt in (0, 1):
            conn = self.connection()
            try:
                return fn(conn)
            except psycopg.OperationalError as e:
                if not conn.closed and conn.info.status == psycopg.pq.ConnStatus.OK:
                    raise CacheError(f"{self.where}: {e}") from None
                self._local.conn = None
                if attempt:
                    raise connect_error(self.where, e) from None
            except psycopg.Error as e:
                raise CacheError(f"{self.where}: {str(e).strip().splitlines()[0]}") from None
        raise AssertionError("unreachable")

    def generation(self) -> tuple[str, int] | None:
        """The counter's (epoch, generation); None where the database has no counter."""
        row = self._run(lambda c: c.execute(STAMP_SQL, prepare=True).fetchone())
        return (str(row[0]), int(row[1])) if row else None

    def _stamp_now(self) -> tuple[str, int] | None:
        return self.generation()

    def _kernel_rows(self, conn: Any, problem_key: str, hardware_id: str) -> Any:
        return conn.execute(self.LOOKUP_SQL, (problem_key, VERIFIED, hardware_id), prepare=True)


def open_reader(location: CacheURL) -> KernelReader | None:
    """A driver-only reader for ``location`` when it is a SQLite file or a psycopg PostgreSQL database at
    :data:`SCHEMA_VERSION`; None otherwise (the caller then opens a ``KernelStore``, which creates, migrates,
    refuses the database or says why it cannot connect)."""
    if not location.driver_only:
        return None
    if location.postgres:
        return _open_postgres(location.url)
    path = location.sqlite_file
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
    except (OSError, sqlite3.Error, CacheError, ValueError) as e:
        log.debug("no driver-only reader for %s: %s", path, e)
    if reader is not None:
        reader.close()
    return None


def _open_postgres(url: str) -> PgReader | None:
    try:
        reader = PgReader(url)
    except CacheError:
        return None
    try:
        if reader.schema_version() == SCHEMA_VERSION and reader.generation() is not None:
            return reader
    except CacheError as e:
        log.debug("no driver-only reader for %s: %s", reader.where, e)
    reader.close()
    return None
