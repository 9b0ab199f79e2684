"""PostgreSQL: the objects a shared cache needs beside the versioned schema, and how kernelsmith connects.

Many hosts write one PostgreSQL cache at once, so three things that SQLite gets from its single write lock are
made explicit here:

* **Schema creation and migrations** run inside a transaction that first takes the advisory lock
  :data:`SCHEMA_LOCK`; the version is read again under it, so processes opening an empty database together
  create it exactly once and the others find it made (see :func:`kernel_cache.migrations.ensure_schema`).
* **Merge rules** (see :class:`kernel_cache.store.KernelStore`): every transaction of the store that writes
  kernels starts by updating the single row of :data:`GENERATION_TABLE`. That row lock orders kernel writers
  across hosts as SQLite's ``BEGIN IMMEDIATE`` orders them in one file, so the two backends merge a key found
  by two writers at once in the same way, and ``INSERT ... ON CONFLICT`` keeps the result right (never a
  duplicate, never a lost row) even against writers that do not take the lock.
* **Invalidation of the lookup memo**: a statement trigger on ``kernels`` bumps the generation counter in
  the writer's own transaction, whoever the writer is (an older kernelsmith, a person with ``psql``). A reader
  reads the counter before the kernels, so a memo entry is never older than the counter it is filed under; a
  changed counter (or epoch, for a database dropped and made again under the same URL) drops the memo.

The compile-time reader of a PostgreSQL cache (psycopg alone, no SQLAlchemy) is
:class:`kernel_cache.reader.PgReader`; it connects with :func:`conninfo` and reads the counter kept here.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kernel_cache.errors import DatabaseUnavailableError
from kernel_cache.schema import GUARD_DDL, GUARD_TABLE, ROOM_DDL, ROOM_TABLE
from kernel_cache.urls import display_url, normalize_url

GENERATION_TABLE = "kernel_cache_generation"
# pg_advisory_xact_lock key for schema creation and migrations: b"kslocksc" as a signed 64-bit integer.
SCHEMA_LOCK = int.from_bytes(b"kslocksc", "big", signed=True)
DEFAULT_CONNECT_TIMEOUT_S = 10
IDLE_IN_TRANSACTION_S = 120
LOCK_TIMEOUT_S = 120
LOCK_TIMEOUT_SQLSTATE = "55P03"  # lock_not_available
# Errors a retried transaction can get past: deadlock_detected, serialization_failure.
RETRY_SQLSTATES = frozenset({"40P01", "40001"})
# What a losing racer gets from CREATE when its rival's DDL committed first (and took no advisory lock):
# duplicate_table, duplicate_object, duplicate_function, unique_violation (on pg_type/pg_class).
ALREADY_EXISTS_SQLSTATES = frozenset({"42P07", "42710", "42723", "23505"})

_GEN_DDL = [
    f"CREATE TABLE IF NOT EXISTS {GENERATION_TABLE} (id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), "
    "epoch VARCHAR(32) NOT NULL, gen BIGINT NOT NULL)",
    f"INSERT INTO {GENERATION_TABLE} (id, epoch, gen) VALUES (1, %(epoch)s, 0) ON CONFLICT (id) DO NOTHING",
    f"""CREATE OR REPLACE FUNCTION {GENERATION_TABLE}_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE {GENERATION_TABLE} SET gen = gen + 1 WHERE id = 1;
        RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS kernels_generation ON kernels",
    f"CREATE TRIGGER kernels_generation AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON kernels "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {GENERATION_TABLE}_bump()",
    GUARD_DDL,
    ROOM_DDL,
]
BUMP_SQL = f"UPDATE {GENERATION_TABLE} SET gen = gen + 1 WHERE id = 1"
STAMP_SQL = f"SELECT epoch, gen FROM {GENERATION_TABLE} WHERE id = 1"


def conninfo(url: str) -> dict[str, Any]:
    """psycopg connection keywords for a SQLAlchemy ``postgresql+psycopg://`` URL (query options pass through,
    e.g. ``?host=/run/postgresql`` for a unix socket)."""
    parts = urlsplit(normalize_url(url))
    if parts.scheme.lower() != "postgresql+psycopg":
        raise DatabaseUnavailableError(f"{display_url(url)}: the fast reader needs the psycopg driver")
    kw: dict[str, Any] = {}
    # Not parts.hostname, which lowercases: SQLAlchemy passes the host as written.
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = hostport.partition(":")
    if port and not port.isdigit():
        raise DatabaseUnavailableError(f"{display_url(url)}: the port {port!r} is not a number")
    if host:
        kw["host"] = host  # as SQLAlchemy passes it: the two paths must reach the same server
    if port:
        kw["port"] = int(port)
    if parts.username:
        kw["user"] = unquote(parts.username)
    if parts.password is not None:
        kw["password"] = unquote(parts.password)
    db = parts.path.lstrip("/")
    if db:
        kw["dbname"] = unquote(db)
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        kw[k] = v
    for k, v in session_defaults(writer=False).items():
        kw.setdefault(k, v)
    return kw


def session_defaults(writer: bool) -> dict[str, Any]:
    """libpq options for kernelsmith's connections, unless the URL sets them.

    libpq waits forever for a host that drops packets, and a server keeps a vanished client's session (and its
    locks) until TCP gives up on it, which takes hours by default. So: a connect timeout, keepalives that find a
    dead peer in about a minute, and for writers a server-side limit on a transaction left idle (a writer that
    hangs while holding the kernel write lock would stall every other writer) and on waiting for a lock."""
    out: dict[str, Any] = {"connect_timeout": DEFAULT_CONNECT_TIMEOUT_S, "application_name": "kernelsmith",
                           "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
    if writer:
        out["options"] = (f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S * 1000} "
                          f"-c lock_timeout={LOCK_TIMEOUT_S * 1000}")
    return out


def connect_error(where: str, e: BaseException) -> DatabaseUnavailableError:
    """One line that says what failed and what to check; never "corrupt": a server that cannot be reached has
    not damaged anything."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    return DatabaseUnavailableError(
        f"cannot connect to PostgreSQL at {where}: {msg}. Check that the server is running and that the URL's "
        "host, port, database, user and password are right (postgresql+psycopg://USER:PASSWORD@HOST:5432/DB)"
    )


def sqlstate(e: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, or of the one a SQLAlchemy error wraps."""
    orig = getattr(e, "orig", e)
    return getattr(orig, "sqlstate", None)


def json_dumps(value: Any) -> str:
    """JSON for PostgreSQL's ``json`` type, which refuses NaN and infinities: those become null (a measurement
    that did not come out), where SQLite would have stored Python's non-standard tokens."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def ensure_extras(conn: Any) -> None:
    """Create the generation counter, its trigger, the graph guard and room tables if missing. ``conn``: a SQLAlchemy
    connection inside a transaction that holds :data:`SCHEMA_LOCK`."""
    for ddl in _GEN_DDL:
        conn.exec_driver_sql(ddl, {"epoch": uuid.uuid4().hex} if "%(epoch)s" in ddl else None)


def has_extras(conn: Any) -> bool:
    row = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE t.tgname = 'kernels_generation' AND c.relname = 'kernels' AND pg_table_is_visible(c.oid) "
        f"AND to_regclass('{GENERATION_TABLE}') IS NOT NULL AND to_regclass('{GUARD_TABLE}') IS NOT NULL "
        f"AND to_regclass('{ROOM_TABLE}') IS NOT NULL"
    ).scalar()
    return bool(row)
