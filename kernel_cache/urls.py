"""Database URLs: where the cache lives by default, and what a URL or a path names.

A URL is read once, by :func:`parse_url`, into a :class:`CacheURL` that every part of the cache takes as it is:
the compile-time reader (which must not import SQLAlchemy), the engines, the store and the commands. A plain path
is a SQLite file; ``postgresql://`` and ``postgres://`` name psycopg 3, the driver the ``postgres`` extra installs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ks_core.settings import Settings


def kernelsmith_home() -> Path:
    """``$KERNELSMITH_HOME``, else ``$XDG_CACHE_HOME/kernelsmith``, else ``~/.cache/kernelsmith``."""
    return Settings.from_env().cache_home()


def default_db_url() -> str:
    """``$KERNELSMITH_DB`` if set, else SQLite at ``kernelsmith_home()/kernels.db``."""
    env = Settings.read("db")
    if env:
        return env
    return f"sqlite:///{kernelsmith_home() / 'kernels.db'}"


def is_postgres_url(url: str) -> bool:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme.split("+", 1)[0] in ("postgresql", "postgres")


def normalize_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` name psycopg 3 (the driver kernelsmith installs); SQLAlchemy would
    otherwise look for psycopg2. An explicit ``+driver`` is kept."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    return url


def display_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return url.replace(parts.netloc, f"{user.partition(':')[0]}:***@{host}", 1)


@dataclass(frozen=True)
class CacheURL:
    """A cache database's URL, read once: what SQLAlchemy connects to, and what the rest of the cache asks of it.

    ``url``: the SQLAlchemy URL (a plain path made an absolute ``sqlite:///`` URL, ``postgresql://`` given psycopg 3).
    ``dialect``: ``sqlite``, ``postgresql``, or whatever other database the URL names. ``sqlite_file``: the file
    behind a SQLite URL, options included; None for in-memory databases and other dialects. ``plain``: no
    ``?options``, so the driver alone opens it as SQLAlchemy would (the compile-time reader's condition)."""

    url: str
    dialect: str
    sqlite_file: Path | None = None
    plain: bool = True

    @property
    def where(self) -> str:
        """What messages call the database: its file, or its URL without the password."""
        return str(self.sqlite_file) if self.sqlite_file is not None else display_url(self.url)

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def driver_only(self) -> bool:
        """Whether :mod:`kernel_cache.reader` can read it without SQLAlchemy: a SQLite file without options, or
        PostgreSQL through psycopg."""
        if self.dialect == "sqlite":
            return self.sqlite_file is not None and self.plain
        return self.url.startswith("postgresql+psycopg://")

    def __str__(self) -> str:
        return self.url


def parse_url(url: str | CacheURL | None) -> CacheURL:
    """Read a SQLAlchemy URL or a plain file path (taken as SQLite); ``None`` or ``""`` means the default database.
    A :class:`CacheURL` is returned as it is, so a URL handed from one part to the next is read once. SQLAlchemy is
    not imported: its engine reads the URL once more when it connects, and refuses one that is not a URL."""
    if isinstance(url, CacheURL):
        return url
    if not url:
        url = default_db_url()
    if "://" not in url:
        path = Path(url).expanduser().resolve()
        return CacheURL(f"sqlite:///{path}", "sqlite", path)
    url = normalize_url(url)
    scheme, _, rest = url.partition("://")
    dialect = scheme.split("+", 1)[0].lower()
    if dialect != "sqlite":
        return CacheURL(url, dialect, None, "?" not in rest)
    # sqlite:///relative.db, sqlite:////absolute.db: the database is whatever follows the third slash.
    database, options, _ = rest.partition("?")
    database = database[1:] if database.startswith("/") else database
    memory = not database or database == ":memory:" or database.startswith("file:")
    return CacheURL(url, dialect, None if memory else Path(database), not options)
