"""KernelStore: the cache's one entry point for problems, kernels, evaluations, runs, evolution steps and misses.

Every method is one short transaction. Writes take SQLite's write lock up front (see :mod:`kernel_cache.db`), so
the judge's pool and several warm-up jobs can write at once without losing anything.

``lookup`` is the hot path (the backend calls it for every region it compiles): one index range scan on
(problem_key, status, hardware_id, rank), then ``fingerprint.match`` in Python on the few rows it returns. On
SQLite it runs on the driver alone, behind a per-process memo that is dropped whenever ``PRAGMA data_version``
says any connection (this process or another) committed, so it never serves a stale answer; that reader is
:class:`kernel_cache.reader.SqliteReader`, which the backend also uses without this class when it only reads.
On PostgreSQL (with psycopg) the same is done by :class:`kernel_cache.reader.PgReader`, whose memo is dropped
when the database's generation counter moves.

Merge rules, the same on both databases, for one key (problem key, source sha256, fingerprint) written by
several processes or hosts at once:

* ``add_kernel``: one row per key; the verdict committed last stands (the row is updated in place, keeping its
  id and ``created_at``). Never a second row, never an error.
* ``merge`` (pack import): a key already present keeps its row and verdict ("kept"); otherwise the kernel is
  added. Of two imports of the same new key, the one that commits first adds it and the other keeps it.
* ``upsert_problem``: the reference written last stands; ``merge`` never replaces a local problem.
* ``record_miss``: every miss counts (the counter is incremented in the database, not read and written back).

SQLite gets this from ``BEGIN IMMEDIATE``: write transactions run one at a time, so read-then-write is safe.
PostgreSQL runs writers side by side, so every transaction that writes kernels first takes the row lock of the
generation counter (the same one-at-a-time order for kernel writes across hosts, without deadlocks between
them), and each write is an ``INSERT ... ON CONFLICT`` that settles a rival the lock did not order (a writer
that does not take it) by the rule above instead of failing. A deadlock or serialization failure reported by
the server rolls the whole transaction back; the method then runs again, up to a few times.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import and_, bindparam, delete, func, inspect, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError

from kernel_cache import postgres as pg
from kernel_cache.db import create_db_engine
from kernel_cache.errors import CacheError, CorruptDatabaseError, NoDatabaseError, NotFoundError
from kernel_cache.migrations import ensure_schema, rank_of
from kernel_cache.models import EvaluationRow, KernelRow, MissRow, ProblemRow, RunRow, StepRow
from kernel_cache.reader import KernelReader, PgReader, SqliteReader, decode_side_result, servable
from kernel_cache.record import (
    RACE,
    REJECTED,
    STATUSES,
    VERIFIED,
    KernelRecord,
    StepRecord,
    source_sha256,
)
from kernel_cache.schema import (
    GUARD_DDL,
    GUARD_TABLE,
    KERNEL_FIELDS,
    PLANLESS_LAST,
    ROOM_DDL,
    ROOM_TABLE,
    room_key,
)
from kernel_cache.urls import CacheURL, parse_url
from ks_core.fingerprint import MATCH_EXACT, MATCH_NONE, EnvFingerprint, minor_version
from ks_core.problem_record import Problem

__all__ = ["KernelStore", "MergeOutcome", "StoreStats"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_K = KernelRow.__table__
_STEP_COLUMNS = ("run_id", "problem_key", "parent_id", "child_id", "mutation", "diff", "prompt", "response",
                 "verdict", "correct", "speedup_delta", "feedback", "id", "created_at")


_RETRIES = 5


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _db_errors(fn: Callable[..., _T]) -> Callable[..., _T]:
    """Turn driver errors into CacheErrors that say what to do; on PostgreSQL, run a transaction the server
    rolled back for a deadlock or a serialization failure again."""

    @functools.wraps(fn)
    def wrapper(self: KernelStore, *args: Any, **kwargs: Any) -> _T:
        if getattr(self, "_postgres", False):
            return _postgres_errors(self, fn, args, kwargs)
        try:
            return fn(self, *args, **kwargs)
        except OperationalError as e:
            msg = str(e.orig) if e.orig is not None else str(e)
            if "locked" in msg or "busy" in msg:
                raise CacheError(f"{self.where} stayed locked by another writer for over 30 s ({msg}); retry") from None
            if "malformed" in msg or "not a database" in msg:
                raise CorruptDatabaseError(f"{self.where} is corrupt ({msg})") from None
            raise CacheError(f"{self.where}: {msg}") from None
        except IntegrityError as e:
            raise CacheError(f"{self.where}: rejected by a constraint: {e.orig}") from None
        except DatabaseError as e:
            raise CorruptDatabaseError(f"{self.where} cannot be read ({e.orig}); it was left untouched") from None
        except sqlite3.OperationalError as e:  # the driver-only reader
            raise CacheError(f"{self.where}: {e}") from None
        except sqlite3.DatabaseError as e:
            raise CorruptDatabaseError(f"{self.where} cannot be read ({e}); it was left untouched") from None

    return wrapper


def _postgres_errors(self: KernelStore, fn: Callable[..., _T], args: Any, kwargs: Any) -> _T:
    for attempt in range(_RETRIES):
        try:
            return fn(self, *args, **kwargs)
        except DatabaseError as e:
            orig = e.orig if e.orig is not None else e
            state = pg.sqlstate(e)
            if state in pg.RETRY_SQLSTATES and attempt < _RETRIES - 1:
                log.info("%s: %s; running the transaction again", self.where, _first_line(orig))
                time.sleep(0.01 * 2 ** attempt)
                continue
            if state == pg.LOCK_TIMEOUT_SQLSTATE:
                raise CacheError(f"{self.where}: another writer held the lock for over {pg.LOCK_TIMEOUT_S} s "
                                 f"({_first_line(orig)}); retry") from None
            if isinstance(e, OperationalError) and (e.connection_invalidated or state is None
                                                    or state.startswith("08")):
                raise pg.connect_error(self.where, orig) from None
            if isinstance(e, IntegrityError):
                raise CacheError(f"{self.where}: rejected by a constraint: {_first_line(orig)}") from None
            # A server's error (permissions, a value too long, a table dropped by hand) has damaged nothing.
            raise CacheError(f"{self.where}: {_first_line(orig)}") from None
    raise AssertionError("unreachable")


@dataclass
class MergeOutcome:
    """What importing one kernel did: ``added``, or ``kept`` (an identical kernel was already here and the local
    row, with its local verdict, stays)."""

    record: KernelRecord
    action: str
    kernel_id: int
    best: bool = False  # it is now the kernel lookup() serves for its key on its hardware


@dataclass
class StoreStats:
    url: str
    schema_version: int
    problems: int = 0
    kernels_by_status: dict[str, int] = field(default_factory=dict)
    kernels_by_backend: dict[str, int] = field(default_factory=dict)
    keys_with_verified: int = 0
    runs: int = 0
    unfinished_runs: int = 0
    evaluations: int = 0
    steps: int = 0
    misses: int = 0
    size_bytes: int | None = None


def _now() -> float:
    return time.time()


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise CacheError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")


def _fingerprint_of(data: dict[str, Any] | None, what: str) -> EnvFingerprint:
    try:
        return EnvFingerprint.from_json(dict(data or {}))
    except (KeyError, TypeError) as e:
        raise CacheError(f"{what}: malformed fingerprint ({e}); expected EnvFingerprint.to_json()") from None


@functools.lru_cache(maxsize=256)
def _fingerprint_ids(fp: EnvFingerprint) -> tuple[str, str]:
    # Hashing the JSON costs more than the insert itself; a process meets only a handful of fingerprints.
    return fp.id, fp.hardware_id


def _record_from_row(row: Any) -> KernelRecord:
    m = row._mapping
    return KernelRecord(**{f: m[f] for f in KERNEL_FIELDS})


class KernelStore:
    """The kernel cache. ``url``: any SQLAlchemy URL, a file path, or a :class:`kernel_cache.urls.CacheURL`; None:
    ``default_db_url()``. ``create=False`` opens only a SQLite file that exists (else :class:`NoDatabaseError`),
    creating neither the file nor its folder: what commands that only read use. Callers open it through
    :func:`kernel_cache.access.open_store`."""

    def __init__(self, url: str | CacheURL | None = None, memo: bool = True, create: bool = True) -> None:
        self.location = parse_url(url)
        self.url = self.location.url
        self._path = self.location.sqlite_file
        self.where = self.location.where
        if not create and self._path is not None and not self._path.exists():
            raise NoDatabaseError(self.where)
        self._engine, self._wengine = create_db_engine(self.location)
        self._postgres = self._engine.dialect.name == "postgresql"
        try:
            # A server database exists before kernelsmith does: without create, an empty one stays empty.
            self.schema_version = ensure_schema(self._engine, self._wengine, self.where,
                                                create=create or not self._postgres)
        except BaseException:
            self._engine.dispose()
            raise
        # Lookups and guard decisions go through the driver-only reader where the driver is there to read with.
        self._reader: KernelReader | None = None
        if self._path is not None:
            self._reader = SqliteReader(self._path, self.where)
        elif self._postgres and self._engine.dialect.driver == "psycopg":
            self._reader = PgReader(self.url, self.where)
        self._memo_enabled = memo and self._reader is not None
        self._lookup_stmt = (
            select(_K)
            .where(and_(_K.c.problem_key == bindparam("key"), _K.c.status == VERIFIED,
                        _K.c.hardware_id == bindparam("hw")))
            .order_by(text(PLANLESS_LAST), _K.c.rank_speedup.desc().nulls_last(), _K.c.median_ms.asc().nulls_last(),
                      _K.c.id.asc())
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._engine.dispose()

    def __enter__(self) -> KernelStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _invalidate(self) -> None:
        if self._reader is not None:
            self._reader.invalidate()

    def _lock_kernels(self, conn: Any) -> None:
        """On PostgreSQL, order this kernel-writing transaction after the others (see the module docstring).
        It comes before the transaction's first kernel row: otherwise two writers could each hold a row the other
        waits for."""
        if self._postgres:
            conn.exec_driver_sql(pg.BUMP_SQL)

    # ------------------------------------------------------------------ problems
    @_db_errors
    def upsert_problem(self, problem: Problem) -> None:
        data = problem.to_json()
        values = {"name": problem.name, "source": problem.source, "op_summary": dict(problem.op_summary),
                  "signature": problem.signature(), "problem_json": data, "updated_at": _now()}
        with self._wengine.begin() as conn:
            self._upsert_problem(conn, problem.key, values)

    def _upsert_problem(self, conn: Any, key: str, values: dict[str, Any]) -> None:
        t = ProblemRow.__table__
        if self._postgres:
            conn.execute(pg_insert(t).values(key=key, created_at=values["updated_at"], **values)
                         .on_conflict_do_update(index_elements=[t.c.key], set_=values))
            return
        if conn.execute(update(t).where(t.c.key == key).values(**values)).rowcount == 0:
            conn.execute(t.insert().values(key=key, created_at=values["updated_at"], **values))

    @_db_errors
    def get_problem(self, key: str) -> Any:
        t = ProblemRow.__table__
        with self._engine.connect() as conn:
            data = conn.execute(select(t.c.problem_json).where(t.c.key == key)).scalar()
        return Problem.from_json(data) if data is not None else None

    @_db_errors
    def problems(self, keys: Iterable[str] | None = None) -> list[Any]:
        t = ProblemRow.__table__
        stmt = select(t.c.problem_json).order_by(t.c.key)
        if keys is not None:
            stmt = stmt.where(t.c.key.in_(list(keys)))
        with self._engine.connect() as conn:
            return [Problem.from_json(d) for d in conn.execute(stmt).scalars()]

    # ------------------------------------------------------------------ kernels
    def _kernel_values(self, rec: KernelRecord) -> dict[str, Any]:
        _check_status(rec.status)
        if rec.sha256 != source_sha256(rec.source):
            raise CacheError(f"kernel for {rec.problem_key}: sha256 does not match its source; refusing to store it")
        fp = _fingerprint_of(rec.fingerprint, f"kernel for {rec.problem_key}")
        fp_id, hw_id = _fingerprint_ids(fp)
        now = _now()
        values = {f: getattr(rec, f) for f in KERNEL_FIELDS if f not in ("id", "created_at")}
        values.update(
            fingerprint=fp.to_json(), fingerprint_id=fp_id, hardware_id=hw_id,
            torch_minor=minor_version(fp.torch_version), triton_minor=minor_version(fp.triton_version),
            rank_speedup=rank_of(rec.speedup_lcb, rec.speedup_inductor, rec.speedup_eager),
            launch_params=dict(rec.launch_params or {}), updated_at=now, trials=int(rec.trials or 0),
            timed=bool(rec.timed),
        )
        values["created_at"] = rec.created_at or now
        return values

    def _find_identical(self, conn: Any, v: dict[str, Any]) -> Any:
        return conn.execute(
            select(_K.c.id, _K.c.status).where(and_(_K.c.problem_key == v["problem_key"], _K.c.sha256 == v["sha256"],
                                                    _K.c.fingerprint_id == v["fingerprint_id"]))
        ).first()

    @_db_errors
    def add_kernel(self, record: KernelRecord) -> int:
        """Store a judged kernel; the same source for the same key and fingerprint updates the existing row (the
        judge's newest verdict on it stands). Returns the kernel id."""
        v = self._kernel_values(record)
        if self._postgres:
            with self._wengine.begin() as conn:
                self._lock_kernels(conn)
                newest = {k: x for k, x in v.items() if k != "created_at"}
                kid = int(conn.execute(pg_insert(_K).values(**v).on_conflict_do_update(
                    constraint="uq_kernels_identity", set_=newest).returning(_K.c.id)).scalar_one())
            self._invalidate()
            return kid
        with self._wengine.begin() as conn:
            hit = self._find_identical(conn, v)
            if hit is not None:
                v.pop("created_at")
                conn.execute(update(_K).where(_K.c.id == hit.id).values(**v))
                kid = int(hit.id)
            else:
                kid = int(conn.execute(_K.insert(), v).inserted_primary_key[0])
        self._invalidate()
        return kid

    @_db_errors
    def add_kernels_bulk(self, records: list[KernelRecord]) -> None:
        """Insert many new kernels in one transaction (no identity check: for building large test databases)."""
        rows = [self._kernel_values(r) for r in records]
        with self._wengine.begin() as conn:
            self._lock_kernels(conn)
            conn.execute(_K.insert(), rows)
        self._invalidate()

    @_db_errors
    def get_kernel(self, kernel_id: int) -> KernelRecord:
        with self._engine.connect() as conn:
            row = conn.execute(select(_K).where(_K.c.id == int(kernel_id))).first()
        if row is None:
            raise NotFoundError(f"no kernel with id {kernel_id} in {self.where}; see `kernelsmith cache ls`")
        return _record_from_row(row)

    @_db_errors
    def lookup(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None:
        """The best verified kernel for ``problem_key`` that may serve on ``fingerprint`` unverified again."""
        if self._memo_enabled:
            assert self._reader is not None
            return self._reader.lookup(problem_key, fingerprint)
        return self._lookup_db(problem_key, fingerprint)

    @_db_errors
    def _lookup_db(self, problem_key: str, fingerprint: EnvFingerprint) -> KernelRecord | None:
        if self._reader is not None:
            # The same query as ``_lookup_stmt``, without the layers of SQLAlchemy's execution machinery, which
            # cost more than the index scan itself.
            return self._reader.lookup(problem_key, fingerprint, memo=False)
        with self._engine.connect() as conn:
            for row in conn.execute(self._lookup_stmt, {"key": problem_key, "hw": fingerprint.hardware_id}):
                rec = _record_from_row(row)
                if servable(rec, EnvFingerprint.from_json(rec.fingerprint), fingerprint) == MATCH_EXACT:
                    return rec
        return None

    @_db_errors
    def lookup_candidates(self, problem_key: str, fingerprint: EnvFingerprint) -> list[tuple[KernelRecord, str]]:
        """Verified kernels for the key on this hardware, best first, each with its match ("exact" or
        "reverify": usable only after the judge verifies it again here)."""
        with self._engine.connect() as conn:
            rows = conn.execute(self._lookup_stmt, {"key": problem_key, "hw": fingerprint.hardware_id}).all()
        out = []
        for row in rows:
            rec = _record_from_row(row)
            m = servable(rec, EnvFingerprint.from_json(rec.fingerprint), fingerprint)
            if m != MATCH_NONE:
                out.append((rec, m))
        return out

    @_db_errors
    def kernels(self, problem_key: str | None = None, status: str | Sequence[str] | None = None, *,
                keys: Iterable[str] | None = None, op_family: str | None = None,
                fingerprint_id: str | None = None, hardware_id: str | None = None,
                min_speedup: float | None = None, limit: int | None = None) -> list[KernelRecord]:
        """Kernels matching every filter given, grouped by key, best first within a key. ``status``: one status or
        several."""
        stmt = select(_K)
        if problem_key is not None:
            stmt = stmt.where(_K.c.problem_key == problem_key)
        if keys is not None:
            stmt = stmt.where(_K.c.problem_key.in_(list(keys)))
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            for s in wanted:
                _check_status(s)
            stmt = stmt.where(_K.c.status.in_(wanted))
        if op_family is not None:
            stmt = stmt.where(_K.c.op_family == op_family)
        if fingerprint_id is not None:
            stmt = stmt.where(_K.c.fingerprint_id == fingerprint_id)
        if hardware_id is not None:
            stmt = stmt.where(_K.c.hardware_id == hardware_id)
        if min_speedup is not None:
            stmt = stmt.where(_K.c.rank_speedup >= float(min_speedup))
        stmt = stmt.order_by(_K.c.problem_key, _K.c.rank_speedup.desc().nulls_last(), _K.c.median_ms.asc().nulls_last(),
                             _K.c.id)
        if limit is not None:
            stmt = stmt.limit(int(limit))
        with self._engine.connect() as conn:
            return [_record_from_row(r) for r in conn.execute(stmt)]

    @_db_errors
    def set_status(self, kernel_id: int, status: str) -> None:
        _check_status(status)
        with self._wengine.begin() as conn:
            self._lock_kernels(conn)
            n = conn.execute(update(_K).where(_K.c.id == int(kernel_id)).values(status=status, updated_at=_now())).rowcount
        if not n:
            raise NotFoundError(f"no kernel with id {kernel_id} in {self.where}")
        self._invalidate()

    @_db_errors
    def delete_kernels(self, kernel_ids: Iterable[int]) -> int:
        ids = [int(i) for i in kernel_ids]
        if not ids:
            return 0
        with self._wengine.begin() as conn:
            self._lock_kernels(conn)
            n = conn.execute(delete(_K).where(_K.c.id.in_(ids))).rowcount
        self._invalidate()
        return int(n)

    @_db_errors
    def merge(self, problems: list[Problem], records: list[KernelRecord]) -> list[MergeOutcome]:
        """Import problems and kernels in ONE transaction: all of it lands or none of it does.

        A problem already here keeps its local reference source.
        A kernel already here (same key, source and fingerprint) keeps its local row: a local verdict is never
        replaced from outside, so a verified entry can never be downgraded by an unverified one, nor a locally
        rejected one revived. Everything else is added; lookup's ranking then serves the best verified kernel.
        """
        staged = [(r, self._kernel_values(r)) for r in records]
        outcomes: list[MergeOutcome] = []
        with self._wengine.begin() as conn:
            self._lock_kernels(conn)
            t = ProblemRow.__table__
            have = set()
            keys = sorted({p.key for p in problems})
            for i in range(0, len(keys), 500):
                have.update(conn.execute(select(t.c.key).where(t.c.key.in_(keys[i:i + 500]))).scalars())
            for p in problems:  # a problem already here keeps its local reference
                if p.key not in have:
                    have.add(p.key)
                    now = _now()
                    conn.execute(pg_insert(t).on_conflict_do_nothing() if self._postgres else t.insert(), {
                        "key": p.key, "name": p.name, "source": p.source, "op_summary": dict(p.op_summary),
                        "signature": p.signature(), "problem_json": p.to_json(), "created_at": now,
                        "updated_at": now})
            existing: dict[tuple[str, str, str], int] = {}
            shas = sorted({v["sha256"] for _, v in staged})
            for i in range(0, len(shas), 500):
                for row in conn.execute(select(_K.c.id, _K.c.problem_key, _K.c.sha256, _K.c.fingerprint_id)
                                        .where(_K.c.sha256.in_(shas[i:i + 500]))):
                    existing[(row.problem_key, row.sha256, row.fingerprint_id)] = int(row.id)
            now = _now()
            for rec, v in staged:
                ident = (v["problem_key"], v["sha256"], v["fingerprint_id"])
                if ident in existing:
                    outcomes.append(MergeOutcome(rec, "kept", existing[ident]))
                    continue
                v["created_at"] = now
                if self._postgres:
                    new = conn.execute(pg_insert(_K).values(**v).on_conflict_do_nothing().returning(_K.c.id)).scalar()
                    if new is None:  # committed meanwhile by a writer that does not take the lock: theirs stays
                        kid = int(self._find_identical(conn, v).id)
                        existing[ident] = kid
                        outcomes.append(MergeOutcome(rec, "kept", kid))
                        continue
                else:
                    new = conn.execute(_K.insert(), v).inserted_primary_key[0]
                kid = int(new)
                existing[ident] = kid
                outcomes.append(MergeOutcome(rec, "added", kid))
        self._invalidate()
        best: dict[tuple[str, EnvFingerprint], int | None] = {}
        for o in outcomes:
            k = (o.record.problem_key, EnvFingerprint.from_json(o.record.fingerprint))
            if k not in best:
                hit = self._lookup_db(*k)
                best[k] = hit.id if hit is not None else None
            o.best = best[k] == o.kernel_id
        return outcomes

    # ------------------------------------------------------------------ evaluations
    @_db_errors
    def add_evaluation(self, problem_key: str, candidate_hash: str, result: Any, run_id: str | None = None) -> int:
        fp_id = _fingerprint_of(result.fingerprint, "evaluation").id if result.fingerprint else ""
        t = EvaluationRow.__table__
        values = {"problem_key": problem_key, "candidate_hash": candidate_hash, "fingerprint_id": fp_id,
                  "run_id": run_id, "verdict": result.verdict, "correct": bool(result.correct),
                  "stage": result.stage, "median_ms": result.candidate_ms, "speedup_eager": result.speedup_eager,
                  "speedup_inductor": result.speedup_inductor, "result": result.to_json(), "created_at": _now()}
        with self._wengine.begin() as conn:
            if run_id is not None and not conn.execute(select(RunRow.id).where(RunRow.id == run_id)).first():
                raise NotFoundError(f"evaluation refers to unknown run {run_id!r}; start_run() first")
            return int(conn.execute(t.insert().values(**values)).inserted_primary_key[0])

    @_db_errors
    def get_evaluation(self, problem_key: str, candidate_hash: str, fingerprint_id: str) -> dict[str, Any] | None:
        """The newest stored verdict of this candidate on this fingerprint, as the judge's JSON
        (``EvalResult.to_json()``; the judge reads it back with ``EvalResult.from_json``), or None."""
        t = EvaluationRow.__table__
        stmt = (select(t.c.result).where(and_(t.c.problem_key == problem_key, t.c.candidate_hash == candidate_hash,
                                              t.c.fingerprint_id == fingerprint_id))
                .order_by(t.c.id.desc()).limit(1))
        with self._engine.connect() as conn:
            data = conn.execute(stmt).scalar()
        return data

    @_db_errors
    def evaluations(self, problem_key: str | None = None, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Stored verdicts, oldest first, of ``problem_key`` and of the runs ``run_ids`` where given: each row's
        ``id``, ``problem_key``, ``candidate_hash``, ``fingerprint_id``, ``run_id``, ``created_at`` and ``result``
        (``EvalResult.to_json()``)."""
        t = EvaluationRow.__table__
        stmt = select(t.c.id, t.c.problem_key, t.c.candidate_hash, t.c.fingerprint_id, t.c.run_id, t.c.created_at,
                      t.c.result).order_by(t.c.id)
        if problem_key is not None:
            stmt = stmt.where(t.c.problem_key == problem_key)
        if run_ids is not None:
            stmt = stmt.where(t.c.run_id.in_(list(run_ids)))
        with self._engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    # ------------------------------------------------------------------ runs
    @_db_errors
    def runs(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Runs, oldest first (all, or those of ``run_ids``): each its ``id``, ``problem_key``, ``fingerprint``,
        ``status`` (running or finished), ``summary`` (``EvolveSummary.to_json()`` once finished), ``started_at``
        and ``finished_at``."""
        t = RunRow.__table__
        stmt = select(t.c.id, t.c.problem_key, t.c.fingerprint, t.c.status, t.c.summary, t.c.started_at,
                      t.c.finished_at).order_by(t.c.started_at, t.c.id)
        if run_ids is not None:
            stmt = stmt.where(t.c.id.in_(list(run_ids)))
        with self._engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    @_db_errors
    def start_run(self, problem_key: str, fingerprint: EnvFingerprint, config: dict[str, Any]) -> str:
        run_id = uuid.uuid4().hex
        now = _now()
        with self._wengine.begin() as conn:
            conn.execute(RunRow.__table__.insert().values(
                id=run_id, problem_key=problem_key, fingerprint=fingerprint.to_json(), fingerprint_id=fingerprint.id,
                config=dict(config), status="running", started_at=now, updated_at=now))
        return run_id

    @_db_errors
    def latest_run(self, problem_key: str, fingerprint: EnvFingerprint, unfinished_only: bool = True) -> str | None:
        t = RunRow.__table__
        stmt = select(t.c.id).where(and_(t.c.problem_key == problem_key, t.c.fingerprint_id == fingerprint.id))
        if unfinished_only:
            stmt = stmt.where(t.c.status == "running")
        with self._engine.connect() as conn:
            return conn.execute(stmt.order_by(t.c.started_at.desc()).limit(1)).scalar()

    def _update_run(self, run_id: str, **values: Any) -> None:
        t = RunRow.__table__
        with self._wengine.begin() as conn:
            n = conn.execute(update(t).where(t.c.id == run_id).values(updated_at=_now(), **values)).rowcount
        if not n:
            raise NotFoundError(f"no run {run_id!r} in {self.where}")

    @_db_errors
    def save_run_state(self, run_id: str, state: dict[str, Any]) -> None:
        self._update_run(run_id, state=state)

    @_db_errors
    def load_run_state(self, run_id: str) -> dict[str, Any] | None:
        with self._engine.connect() as conn:
            return conn.execute(select(RunRow.state).where(RunRow.id == run_id)).scalar()

    @_db_errors
    def last_why(self, problem_key: str) -> str | None:
        """The one-line reason the latest finished search of ``problem_key`` stored no served kernel (its summary's
        ``why``), or None where no finished search left one."""
        t = RunRow.__table__
        stmt = (select(t.c.summary).where(and_(t.c.problem_key == problem_key, t.c.status == "finished"))
                .order_by(t.c.finished_at.desc()).limit(1))
        with self._engine.connect() as conn:
            summary = conn.execute(stmt).scalar()
        why = (summary or {}).get("why") if isinstance(summary, dict) else None
        return why or None

    @_db_errors
    def finish_run(self, run_id: str, summary: dict[str, Any]) -> None:
        self._update_run(run_id, summary=summary, status="finished", finished_at=_now())

    # ------------------------------------------------------------------ evolution steps
    @_db_errors
    def add_step(self, step: StepRecord) -> int:
        data = step.to_json()
        values = {k: data[k] for k in _STEP_COLUMNS if k not in ("id", "created_at")}
        values["detail"] = {k: v for k, v in data.items() if k not in _STEP_COLUMNS}
        values["created_at"] = step.created_at or _now()
        with self._wengine.begin() as conn:
            if not conn.execute(select(RunRow.id).where(RunRow.id == step.run_id)).first():
                raise NotFoundError(f"step refers to unknown run {step.run_id!r}; start_run() first")
            return int(conn.execute(StepRow.__table__.insert().values(**values)).inserted_primary_key[0])

    @_db_errors
    def steps(self, run_id: str | None = None, problem_key: str | None = None) -> list[StepRecord]:
        t = StepRow.__table__
        stmt = select(t).order_by(t.c.id)
        if run_id is not None:
            stmt = stmt.where(t.c.run_id == run_id)
        if problem_key is not None:
            stmt = stmt.where(t.c.problem_key == problem_key)
        out = []
        with self._engine.connect() as conn:
            for row in conn.execute(stmt):
                m = row._mapping
                data = {k: m[k] for k in _STEP_COLUMNS}
                data.update(m["detail"] or {})
                out.append(StepRecord.from_json(data))
        return out

    # ------------------------------------------------------------------ graph guard decisions
    # What the backend's graph guard measured for a graph with its swapped kernels: re-measuring it costs a second
    # Inductor compile and timed runs on every compile of the graph in every process. It is a cache of
    # measurements that can always be taken again, so the table lives beside the versioned schema: it is created
    # by the first decision stored, and a kernelsmith that predates it opens the database as before.
    @_db_errors
    def guard_decision(self, key: str) -> dict[str, Any] | None:
        """The stored result (``GuardResult.to_json()``) for ``key``, or None."""
        if self._reader is not None:
            return self._reader.guard_decision(key)
        with self._engine.connect() as conn:
            if not inspect(conn).has_table(GUARD_TABLE):
                return None
            row = conn.execute(text(f"SELECT result FROM {GUARD_TABLE} WHERE key = :k"), {"k": key}).first()
        return decode_side_result(row[0]) if row is not None else None

    @_db_errors
    def put_guard_decision(self, key: str, fingerprint_id: str, result: dict[str, Any]) -> None:
        """Store (or replace) the graph guard's result for ``key``."""
        values = {"k": key, "f": fingerprint_id, "kept": bool(result.get("kept")),
                  "r": json.dumps(result, sort_keys=True), "t": _now()}
        with self._wengine.begin() as conn:
            if self._postgres:  # the table is made with the schema (kernel_cache.postgres.ensure_extras)
                conn.execute(text(f"INSERT INTO {GUARD_TABLE} (key, fingerprint_id, kept, result, created_at) "
                                  "VALUES (:k, :f, :kept, :r, :t) ON CONFLICT (key) DO UPDATE SET "
                                  "fingerprint_id = EXCLUDED.fingerprint_id, kept = EXCLUDED.kept, "
                                  "result = EXCLUDED.result, created_at = EXCLUDED.created_at"), values)
                return
            conn.execute(text(GUARD_DDL))
            conn.execute(text(f"DELETE FROM {GUARD_TABLE} WHERE key = :k"), {"k": key})
            conn.execute(text(f"INSERT INTO {GUARD_TABLE} (key, fingerprint_id, kept, result, created_at) "
                              "VALUES (:k, :f, :kept, :r, :t)"), values)

    @_db_errors
    def clear_guard_decisions(self) -> int:
        """Forget every stored graph guard decision (the next compile of each graph measures again)."""
        with self._wengine.begin() as conn:
            if not inspect(conn).has_table(GUARD_TABLE):
                return 0
            return int(conn.execute(text(f"DELETE FROM {GUARD_TABLE}")).rowcount or 0)

    # ------------------------------------------------------------------ rooms
    # A region's baselines and floor on one machine (``ks_inductor.judge.room.Room``): warm and the evolver store
    # them, explain shows them, and the backend serves eager's ops for a region where they are the faster baseline.
    @_db_errors
    def room(self, problem_key: str, fingerprint_id: str) -> dict[str, Any] | None:
        """The stored room (``Room.to_json()``) of ``problem_key`` on the machine ``fingerprint_id``, or None."""
        if self._reader is not None:
            return self._reader.room(problem_key, fingerprint_id)
        with self._engine.connect() as conn:
            if not inspect(conn).has_table(ROOM_TABLE):
                return None
            row = conn.execute(text(f"SELECT result FROM {ROOM_TABLE} WHERE key = :k"),
                               {"k": room_key(problem_key, fingerprint_id)}).first()
        return decode_side_result(row[0]) if row is not None else None

    @_db_errors
    def put_room(self, problem_key: str, fingerprint_id: str, room: dict[str, Any]) -> None:
        """Store (or replace) the room of ``problem_key`` on the machine ``fingerprint_id``."""
        values = {"k": room_key(problem_key, fingerprint_id), "p": problem_key, "f": fingerprint_id,
                  "r": json.dumps(room, sort_keys=True), "t": _now()}
        cols = "(key, problem_key, fingerprint_id, result, created_at) VALUES (:k, :p, :f, :r, :t)"
        with self._wengine.begin() as conn:
            if self._postgres:  # the table is made with the schema (kernel_cache.postgres.ensure_extras)
                conn.execute(text(f"INSERT INTO {ROOM_TABLE} {cols} ON CONFLICT (key) DO UPDATE SET "
                                  "result = EXCLUDED.result, created_at = EXCLUDED.created_at"), values)
                return
            conn.execute(text(ROOM_DDL))
            conn.execute(text(f"DELETE FROM {ROOM_TABLE} WHERE key = :k"), {"k": values["k"]})
            conn.execute(text(f"INSERT INTO {ROOM_TABLE} {cols}"), values)

    # ------------------------------------------------------------------ misses
    @_db_errors
    def record_miss(self, problem: Problem, fingerprint: EnvFingerprint) -> None:
        t = MissRow.__table__
        now = _now()
        shapes = [s.shape for s in problem.input_specs if s.kind == "tensor"]
        if self._postgres:
            with self._wengine.begin() as conn:
                conn.execute(pg_insert(t).values(
                    problem_key=problem.key, count=1, signature=problem.signature(), shapes=shapes,
                    problem_json=problem.to_json(), fingerprint=fingerprint.to_json(), first_seen=now, last_seen=now,
                ).on_conflict_do_update(index_elements=[t.c.problem_key], set_={
                    "count": t.c.count + 1, "last_seen": now, "fingerprint": fingerprint.to_json(), "shapes": shapes}))
            return
        with self._wengine.begin() as conn:
            n = conn.execute(update(t).where(t.c.problem_key == problem.key).values(
                count=t.c.count + 1, last_seen=now, fingerprint=fingerprint.to_json(), shapes=shapes)).rowcount
            if not n:
                conn.execute(t.insert().values(
                    problem_key=problem.key, count=1, signature=problem.signature(), shapes=shapes,
                    problem_json=problem.to_json(), fingerprint=fingerprint.to_json(), first_seen=now, last_seen=now))

    @_db_errors
    def misses(self) -> list[dict[str, Any]]:
        t = MissRow.__table__
        with self._engine.connect() as conn:
            rows = conn.execute(select(t).order_by(t.c.count.desc(), t.c.last_seen.desc())).all()
        return [{"key": r.problem_key, "count": r.count, "signature": r.signature, "shapes": r.shapes,
                 "first_seen": r.first_seen, "last_seen": r.last_seen, "source": r.problem_json.get("source", ""),
                 "problem": r.problem_json, "fingerprint": r.fingerprint} for r in rows]

    @_db_errors
    def clear_miss(self, problem_key: str) -> None:
        with self._wengine.begin() as conn:
            conn.execute(delete(MissRow.__table__).where(MissRow.problem_key == problem_key))

    # ------------------------------------------------------------------ maintenance
    @_db_errors
    def stats(self) -> StoreStats:
        s = StoreStats(url=self.url, schema_version=self.schema_version)
        with self._engine.connect() as conn:
            def count(model: Any, *where: Any) -> int:
                return int(conn.execute(select(func.count()).select_from(model).where(*where)).scalar() or 0)

            s.problems = count(ProblemRow)
            s.kernels_by_status = {st: n for st, n in conn.execute(
                select(_K.c.status, func.count()).group_by(_K.c.status))}
            s.kernels_by_backend = {b: n for b, n in conn.execute(
                select(_K.c.backend, func.count()).group_by(_K.c.backend))}
            s.keys_with_verified = int(conn.execute(
                select(func.count(func.distinct(_K.c.problem_key))).where(_K.c.status == VERIFIED)).scalar() or 0)
            s.runs = count(RunRow)
            s.unfinished_runs = count(RunRow, RunRow.status == "running")
            s.evaluations = count(EvaluationRow)
            s.steps = count(StepRow)
            s.misses = count(MissRow)
        if self._postgres:
            with self._engine.connect() as conn:
                s.size_bytes = int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar() or 0)
        if self._path is not None and self._path.exists():
            s.size_bytes = sum(p.stat().st_size for p in (self._path, self._path.with_name(self._path.name + "-wal"))
                               if p.exists())
        return s

    @_db_errors
    def gc_plan(self, keep: int = 3, drop_rejected: bool = True) -> list[KernelRecord]:
        """Kernels gc would delete: rejected ones, and verified (or race) ones ranked below the ``keep`` best for their
        key and fingerprint. Quarantined kernels stay: they await review."""
        doomed: list[KernelRecord] = []
        seen: dict[tuple[str, str], int] = {}
        for rec in self.kernels():
            if rec.status == REJECTED and drop_rejected:
                doomed.append(rec)
            elif rec.status in (VERIFIED, RACE):
                k = (rec.problem_key, EnvFingerprint.from_json(rec.fingerprint).id)
                seen[k] = seen.get(k, 0) + 1
                if seen[k] > keep:
                    doomed.append(rec)
        return doomed

    @_db_errors
    def vacuum(self) -> None:
        if self._engine.dialect.name != "sqlite":
            return
        with self._engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.rollback()
            conn.connection.driver_connection.execute("VACUUM")

