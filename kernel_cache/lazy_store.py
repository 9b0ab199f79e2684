"""What the compile backend holds for a database: the driver-only reader while it only reads, the full store once
something else is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernel_cache.reader import open_reader
from kernel_cache.record import KernelRecord
from kernel_cache.urls import CacheURL
from ks_core.fingerprint import EnvFingerprint

if TYPE_CHECKING:
    from kernel_cache.store import KernelStore
    from ks_core.problem_record import Problem


class LazyKernelStore:
    """Lookups and guard decisions through a :class:`kernel_cache.reader.KernelReader` when the database allows
    it; a :class:`kernel_cache.store.KernelStore` (and SQLAlchemy) only when something else is asked for, such as
    recording a miss or storing a decision, or when the database must be created, migrated or refused."""

    def __init__(self, location: CacheURL) -> None:
        self.location = location
        self.url = location.url
        self._store: KernelStore | None = None
        self._reader = open_reader(location)
        if self._reader is None:
            self.full()

    def full(self) -> KernelStore:
        """The full store (opened now if it is not yet): what a search on a miss writes to."""
        if self._store is None:
            # Imported on first need: the store's module imports SQLAlchemy, which a compile that only reads
            # would otherwise pay for in every process.
            from kernel_cache.store import KernelStore

            self._store = KernelStore(self.location)
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

    def room(self, problem_key: str, fingerprint_id: str) -> dict[str, Any] | None:
        if self._store is not None:
            return self._store.room(problem_key, fingerprint_id)
        assert self._reader is not None
        return self._reader.room(problem_key, fingerprint_id)

    def last_why(self, problem_key: str) -> str | None:
        return self.full().last_why(problem_key)

    def record_miss(self, problem: Problem, fingerprint: EnvFingerprint) -> None:
        self.full().record_miss(problem, fingerprint)

    def put_guard_decision(self, key: str, fingerprint_id: str, result: dict[str, Any]) -> None:
        self.full().put_guard_decision(key, fingerprint_id, result)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._store is not None:
            self._store.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.full(), name)
