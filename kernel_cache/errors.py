"""Errors of the kernel cache and packs. Every message says what went wrong and what to do about it."""

from __future__ import annotations


class CacheError(Exception):
    """Base class: anything the kernel cache refuses or cannot do."""


class DatabaseUnavailableError(CacheError):
    """The database cannot be opened (bad URL, missing driver, unreadable path)."""


class NoDatabaseError(DatabaseUnavailableError):
    """A command that only reads found no database where it looked; it created none."""

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(f"no kernel cache at {where}")


class CorruptDatabaseError(CacheError):
    """The file is not a kernelsmith database, or SQLite reports it damaged. It is never modified or deleted."""


class SchemaTooNewError(CacheError):
    """The database was written by a newer kernelsmith than this one."""


class NotFoundError(CacheError):
    """A kernel id, run id or problem key that is not in the database."""


class PackError(CacheError):
    """A pack that cannot be written, read, trusted or imported. ``reasons`` lists every problem found."""

    def __init__(self, message: str, reasons: list[str] | None = None) -> None:
        self.reasons = list(reasons or [])
        detail = "".join(f"\n  - {r}" for r in self.reasons)
        super().__init__(message + detail)


class SigningUnavailableError(PackError):
    """Signing was asked for but the ``cryptography`` package is missing."""


class KeyFileError(PackError):
    """A signing or trusted key that is not there, or not the kind of key asked for: a mistake in what the user
    named, not a fault of the pack."""
