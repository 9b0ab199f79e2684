"""Several writer processes at once, and a writer killed with SIGKILL mid-run."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from kernel_cache.store import KernelStore
from kernel_cache.testing import h200
from tests.writers import BATCH, KILLED_WRITER, ROOT, subprocess_env

_WRITER = r"""
import os, sys, time
from kernel_cache.store import KernelStore
from kernel_cache.testing import h200, make_record
from ks_inductor.judge.verdict import EvalResult

db, wid, n, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = KernelStore(db)
open(os.path.join(tmp, f"ready-{wid}"), "w").close()
while not os.path.exists(os.path.join(tmp, "go")):
    time.sleep(0.01)
fp = h200()
run = store.start_run(f"key-{wid}", fp, {"writer": wid})
for i in range(n):
    store.add_kernel(make_record(f"key-{wid}", f"{wid}-{i}", fp, speedup_lcb=1.0 + i / 100))
    # Every writer also stores the same kernel: one row must come out of it, not one per writer.
    store.add_kernel(make_record("shared", "same", fp, speedup_lcb=1.5))
    res = EvalResult(correct=True, verdict="accepted", fingerprint=fp.to_json(), candidate_hash=f"{wid}-{i}")
    store.add_evaluation(f"key-{wid}", f"{wid}-{i}", res, run_id=run)
store.finish_run(run, {"n": n})
store.close()
"""

def test_several_writer_processes_lose_nothing(tmp_path):
    db = str(tmp_path / "k.db")
    KernelStore(db).close()
    writers, n = 4, 25
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, db, str(w), str(n), str(tmp_path)], cwd=ROOT,
                              env=subprocess_env(), stderr=subprocess.PIPE, text=True) for w in range(writers)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < writers and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    (tmp_path / "go").touch()  # all start writing together
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with KernelStore(db) as s:
        fp = h200()
        for w in range(writers):
            assert len(s.kernels(problem_key=f"key-{w}")) == n
            assert s.lookup(f"key-{w}", fp).speedup_lcb == pytest.approx(1.0 + (n - 1) / 100)
        assert len(s.kernels(problem_key="shared")) == 1
        st = s.stats()
        assert (st.evaluations, st.runs, st.unfinished_runs) == (writers * n, writers, 0)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_writer_killed_mid_run_leaves_consistent_database(tmp_path):
    db, log = str(tmp_path / "k.db"), tmp_path / "committed.log"
    KernelStore(db).close()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, db, str(log)], cwd=ROOT, env=subprocess_env(),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("batch") >= 5:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    committed: set[int] = set()
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "solo" and len(parts) == 2:
            committed.add(int(parts[1]))
        elif parts and parts[0] == "batch" and len(parts) == BATCH + 2:  # a line cut by the kill is not counted
            committed.update(int(x) for x in parts[2:])
    assert len(committed) >= 5 * 51

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    present = {r[0] for r in conn.execute("SELECT id FROM kernels")}
    batch_rows = conn.execute("SELECT COUNT(*) FROM kernels WHERE problem_key = 'batch'").fetchone()[0]
    conn.close()
    assert committed <= present  # every committed row survived
    assert batch_rows % BATCH == 0  # and no transaction survived in part
    with KernelStore(db) as s:  # the store opens it normally and keeps writing
        s.add_kernel(s.kernels(problem_key="solo")[0])
        assert s.lookup("batch", h200()) is not None
