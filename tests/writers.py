"""A writer process that the cache tests kill mid-run (SQLite and PostgreSQL alike), and the environment their
subprocesses import the checkout from."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 50  # kernels merged in one transaction: a kill often lands inside one

# argv: database URL, log file. Logs each committed write, so a test can tell what must have survived the kill.
KILLED_WRITER = r"""
import sys
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200, make_record

db, log = sys.argv[1], sys.argv[2]
store = KernelStore(db)
fp = h200()
with open(log, "a", buffering=1) as out:
    i = 0
    while True:
        kid = store.add_kernel(make_record("solo", f"s{i}", fp))
        out.write(f"solo {kid}\n")
        outcomes = store.merge([], [make_record("batch", f"b{i}-{j}", fp) for j in range(BATCH)])
        out.write(f"batch {i} {' '.join(str(o.kernel_id) for o in outcomes)}\n")
        i += 1
""".replace("BATCH", str(BATCH))


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env
