"""Where the commands' output goes, and how the caches they read are opened.

stdout carries a command's result and nothing else: the table, or with ``--json`` one JSON document. Progress,
status lines, warnings and errors go to stderr. When stdout is not a terminal (a pipe, a file) nothing printed
there is cut or wrapped: tables are as wide as their contents, and sources are written as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ks_inductor.cli.args import EXIT_NOTHING, EXIT_USAGE, UsageError

# The width of a console that is not a terminal: wide enough that no table column or line is ever cut.
UNLIMITED_WIDTH = 1 << 15


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(stderr=stderr, width=None if tty else UNLIMITED_WIDTH, soft_wrap=not tty, highlight=False)


def out_console() -> Console:
    """The result's console: stdout."""
    return _console(stderr=False)


def err_console() -> Console:
    """Progress, status lines and errors: stderr."""
    return _console(stderr=True)


def result_console(args: argparse.Namespace) -> Console:
    """Where a command's human-readable lines go: stdout, or stderr when stdout carries ``--json``."""
    return err_console() if getattr(args, "json", False) else out_console()


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def print_error(message: str) -> None:
    err_console().print(f"[red]error:[/] {escape(message)}", soft_wrap=True)


def fail(args: argparse.Namespace, e: BaseException, code: int) -> int:
    """Report ``e`` (one line on stderr; with ``--json`` also a JSON object on stdout) and return ``code``."""
    if getattr(args, "json", False):
        print_json({"ok": False, "exit_code": code, "error": str(e), "reasons": getattr(e, "reasons", [])})
    print_error(str(e))
    return code


def fmt_number(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def fmt_speedup(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def fmt_when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


# ---------------------------------------------------------------------------------------------- caches


def cache_named(args: argparse.Namespace) -> bool:
    """Whether the user named the cache (``--db`` or ``$KERNELSMITH_DB``) rather than taking the default one."""
    from ks_core.settings import Settings

    return getattr(args, "db", None) is not None or Settings.from_env().db is not None


def check_db_folder(args: argparse.Namespace) -> None:
    """A SQLite file the user named (``--db`` or ``$KERNELSMITH_DB``) must be in a folder that exists: no command
    creates a mistyped folder, and none reads a mistyped path as an empty cache. The default cache's folder in
    ``$KERNELSMITH_HOME`` is created where it is missing."""
    from kernel_cache.urls import parse_url
    from ks_core.settings import Settings

    if not hasattr(args, "db"):
        return
    named = args.db if args.db is not None else Settings.from_env().db
    path = parse_url(named).sqlite_file if named else None
    if path is not None and not path.parent.is_dir():
        flag = "--db" if args.db is not None else "KERNELSMITH_DB"
        raise UsageError(f"no kernel cache at {named}: the folder {path.parent} does not exist (check {flag}; a "
                         "cache is created where its folder exists)")


def missing_cache(args: argparse.Namespace, e: Any) -> None:
    """A command that only reads found no cache. A SQLite file the user named is a usage error (a mistyped path
    must not read as an empty cache); the default file not existing yet, or a server database kernelsmith has not
    written to yet (one that cannot be reached is another error), means nothing is stored yet: a line on stderr."""
    if cache_named(args) and "://" not in e.where:
        where = Path(e.where)
        why = "its folder does not exist" if not where.parent.is_dir() else "nothing has been stored there"
        raise UsageError(f"no kernel cache at {e.where}: {why} (check --db; warm, evolve and pack import create "
                         "one)")
    err_console().print(f"{escape(str(e))}; nothing is stored yet", soft_wrap=True)


def cache_error_code(e: Exception) -> int:
    """2 for a cache or key the user named wrongly (it cannot be opened, is not a kernelsmith database, an unknown
    id, a key file that is missing or of the wrong kind); 1 for what the job itself found (a refused pack)."""
    from kernel_cache.errors import (
        CorruptDatabaseError,
        DatabaseUnavailableError,
        KeyFileError,
        NotFoundError,
        SchemaTooNewError,
    )

    usage = (DatabaseUnavailableError, NotFoundError, CorruptDatabaseError, SchemaTooNewError, KeyFileError)
    return EXIT_USAGE if isinstance(e, usage) else EXIT_NOTHING


def match_keys(store: Any, prefixes: list[str] | None) -> list[str] | None:
    """The problem keys in ``store`` that start with one of ``prefixes`` (``--key``); None when none were given.
    A prefix that names no problem is a usage error."""
    if not prefixes:
        return None
    keys = [p.key for p in store.problems()]
    found: list[str] = []
    for prefix in prefixes:
        hits = [k for k in keys if k.startswith(prefix)]
        if not hits:
            raise UsageError(f"--key {prefix}: no problem key in the cache starts with it")
        found += [k for k in hits if k not in found]
    return found


def require_file(path: str, what: str) -> None:
    """A file the command reads must be there before anything else is said about it."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} not found: {path}")
    if not p.is_file():
        raise UsageError(f"{what} is not a file: {path}")
