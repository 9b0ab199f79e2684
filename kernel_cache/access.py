"""How every part of kernelsmith opens a kernel cache: :func:`open_store`, over a URL read once.

The compile backend, the commands, the optimizer, ``warm`` (and its Ray workers) and the serving integrations all
open a database here, so a URL means the same database everywhere and is parsed in one place
(:func:`kernel_cache.urls.parse_url`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from kernel_cache.lazy_store import LazyKernelStore
from kernel_cache.urls import CacheURL, parse_url

if TYPE_CHECKING:
    from kernel_cache.store import KernelStore

__all__ = ["open_store"]


@overload
def open_store(url: str | CacheURL | None = None, *, create: bool = True,
               lazy: Literal[False] = False) -> KernelStore: ...


@overload
def open_store(url: str | CacheURL | None = None, *, create: bool = True,
               lazy: Literal[True]) -> LazyKernelStore: ...


def open_store(url: str | CacheURL | None = None, *, create: bool = True,
               lazy: bool = False) -> KernelStore | LazyKernelStore:
    """The cache at ``url``: a SQLite path, a ``sqlite:///`` URL, a ``postgresql://`` URL, any SQLAlchemy URL, or a
    :class:`CacheURL` already read; None means ``$KERNELSMITH_DB`` or the default file.

    ``create=False``: a SQLite file that does not exist is :class:`kernel_cache.errors.NoDatabaseError` rather than
    created (commands that only read). ``lazy``: lookups go through the database driver alone until something
    else is asked for (:class:`LazyKernelStore`: what a compile holds, so that one that only reads never imports
    SQLAlchemy); otherwise the full :class:`kernel_cache.store.KernelStore`."""
    location = parse_url(url)
    if lazy:
        return LazyKernelStore(location)
    # Imported on first need: the store's module imports SQLAlchemy, which a lazy open must not pay for.
    from kernel_cache.store import KernelStore

    return KernelStore(location, create=create)
