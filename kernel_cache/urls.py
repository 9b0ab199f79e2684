"""Database URLs: where the cache lives by default, and what a URL or a path names.

Every part of the cache reads a URL through here: the compile-time reader (which must not import SQLAlchemy), the
engines, the store and the commands. A plain path is a SQLite file; ``postgresql://`` and ``postgres://`` name
psycopg 3, the driver the ``postgres`` extra installs.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from kernel_cache.settings import Settings


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


def resolve_url(url: str | None) -> str:
    """Accept a SQLAlchemy URL or a plain file path (taken as SQLite); ``None`` means the default."""
    if not url:
        url = default_db_url()
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return normalize_url(url)


def display_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return url.replace(parts.netloc, f"{user.partition(':')[0]}:***@{host}", 1)


def sqlite_file(url: str) -> Path | None:
    """The file behind a plain path or a ``sqlite:///`` URL without options; None for anything else (in-memory,
    ``file:`` URIs, query strings, other engines): those are left to SQLAlchemy's parser (:func:`sqlite_path`)."""
    if "://" not in url:
        return Path(url).expanduser().resolve()
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url:
        return None
    rest = url[len(prefix):]
    if not rest or rest == ":memory:" or rest.startswith("file:"):
        return None
    return Path(rest)


def sqlite_path(url: str) -> Path | None:
    """The file behind any SQLite URL, options included; None for in-memory databases and other dialects."""
    # SQLAlchemy's parser, imported here alone: the compile path reads URLs through sqlite_file without it.
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None
    return Path(u.database)
