"""The tests' throwaway PostgreSQL server (kernel_cache.testing_postgres): ``postgres_cluster`` (one per test
process) starts it, ``postgres_url`` gives each test an empty database of its own.

Without the binaries (or psycopg) the tests that ask for a server are skipped, saying why; with ``CI=true``
they fail instead, since CI must run them (``make test`` installs the server where it can).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from kernel_cache.testing_postgres import PostgresCluster, find_bindir


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip, or fail under CI: a CI run without the server would pass while testing nothing."""
    if _in_ci():
        pytest.fail(f"CI=true but {reason}; CI must run the PostgreSQL tests (make test installs the server)",
                    pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_cluster():
    bindir = find_bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's postgresql package")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed; pip install 'kernelsmith[postgres]'")
    try:
        cluster = PostgresCluster(bindir).start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        unavailable(f"could not start a throwaway PostgreSQL server: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster):
    """The URL of an empty database on the session's throwaway server."""
    return postgres_cluster.create_database()
