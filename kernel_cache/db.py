"""Engine creation: how SQLAlchemy reaches a cache database, and how SQLite is set up for many concurrent writers.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with ``BEGIN IMMEDIATE``: a
deferred transaction that reads first and writes later can fail at once with "database is locked" (the busy
handler cannot help a reader that must upgrade), while an immediate one simply waits its turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from kernel_cache.errors import CorruptDatabaseError, DatabaseUnavailableError
from kernel_cache.postgres import json_dumps, session_defaults
from kernel_cache.schema import SQLITE_MAGIC
from kernel_cache.urls import CacheURL

BUSY_TIMEOUT_MS = 30_000
# Execution option marking an engine whose transactions write (BEGIN IMMEDIATE on SQLite).
WRITE_OPTION = "ks_write"


def check_sqlite_file(path: Path) -> None:
    """Refuse a file that exists but is not SQLite, before SQLAlchemy touches it."""
    if not path.exists():
        return
    if path.is_dir():
        raise DatabaseUnavailableError(f"{path} is a directory; pass a database file path with --db")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise DatabaseUnavailableError(f"cannot read database {path}: {e.strerror}") from None
    if head and head != SQLITE_MAGIC:
        raise CorruptDatabaseError(
            f"{path} is not a SQLite database (bad header); it was left untouched. "
            "Move it aside or pass another file with --db / KERNELSMITH_DB."
        )


def create_db_engine(location: CacheURL) -> tuple[Engine, Engine]:
    """Return (engine for reads, engine for writes); both share one connection pool."""
    try:
        u = make_url(location.url)  # the engine's own reading of the URL, handed to create_engine as it is
    except ArgumentError as e:
        raise DatabaseUnavailableError(f"not a database URL: {location.where!r} ({e})") from None
    path = location.sqlite_file
    kwargs: dict[str, Any] = {}
    if u.get_backend_name() == "sqlite":
        if path is not None:
            check_sqlite_file(path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseUnavailableError(f"cannot create directory {path.parent}: {e.strerror}") from None
        # The driver's own transaction handling is switched off below; the timeout covers connect-time locks.
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    elif u.get_backend_name() == "postgresql":
        kwargs["pool_pre_ping"] = True
        kwargs["json_serializer"] = json_dumps
        if u.get_driver_name() in ("psycopg", "psycopg2"):
            kwargs["connect_args"] = {k: v for k, v in session_defaults(writer=True).items() if k not in u.query}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(u, **kwargs)
    except (NoSuchModuleError, ImportError) as e:
        raise DatabaseUnavailableError(
            f"no driver for {u.get_backend_name()!r} ({e}); install the database driver or use sqlite"
        ) from None
    if u.get_backend_name() == "sqlite":
        _setup_sqlite(engine, in_memory=path is None)
    return engine, engine.execution_options(**{WRITE_OPTION: True})


def _setup_sqlite(engine: Engine, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see the module docstring)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        if not in_memory:
            # Setting WAL on a database already in WAL mode writes nothing, so a read-only open stays read-only.
            mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")  # durable at each checkpoint; safe against process crashes
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
