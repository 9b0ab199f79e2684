"""A throwaway PostgreSQL server for tests and benchmarks: Debian's server binaries, a temporary folder, a unix socket.

:func:`find_bindir` finds ``initdb`` and ``pg_ctl`` on ``$PATH`` or in ``/usr/lib/postgresql/*/bin``; the server
listens on a unix socket in its own folder only, so parallel test processes never compete for a port. PostgreSQL
refuses to run as root, so under root the cluster belongs to the ``postgres`` system user (else ``nobody``).
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

_SERVER_OPTIONS = [
    "-c", "listen_addresses=",
    # Durability against a crash of the machine is not what these tests check; a killed client is.
    "-c", "fsync=off", "-c", "full_page_writes=off",
    "-c", "max_connections=200", "-c", "shared_buffers=32MB",
]


def find_bindir() -> Path | None:
    """The folder with initdb and pg_ctl: from $PATH, else the newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    for initdb in reversed(candidates):
        bindir = Path(initdb).parent
        if (bindir / "pg_ctl").exists():
            return bindir
    return None


class PostgresCluster:
    """One server in a temporary folder; ``url(name)`` is a SQLAlchemy URL for a database on it."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="ks-pg-", dir="/tmp"))  # short: a socket path has ~100 bytes
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.user: int | None = None
        self.group: int | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pw = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user, self.group = pw.pw_uid, pw.pw_gid
                break
            else:
                raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run the server")
            os.chown(self.base, self.user, self.group)
        self._names = itertools.count()
        self.running = False

    def _run(self, *args: str) -> None:
        env = dict(os.environ, LC_ALL="C", LANG="C")
        res = subprocess.run([str(self.bindir / args[0]), *args[1:]], cwd=self.base, env=env, user=self.user,
                             group=self.group, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        if res.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({res.returncode}): {res.stdout[-2000:]}\n{log}")

    def _options(self) -> str:
        return " ".join([*_SERVER_OPTIONS, "-k", str(self.base)]).replace("listen_addresses=", "listen_addresses=''")

    def start(self) -> PostgresCluster:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale",
                  "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", self._options(),
                  "start")
        self.running = True
        atexit.register(self.stop)
        return self

    def restart(self) -> None:
        """Stop (dropping every client connection) and start again."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "fast", "-w", "-t", "60", "-o",
                  self._options(), "restart")

    def stop(self) -> None:
        if self.running:
            self.running = False
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{dbname}?host={self.base}"

    def create_database(self) -> str:
        """An empty database of its own; returns its URL."""
        import psycopg

        name = f"ks_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(host=str(self.base), user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)
