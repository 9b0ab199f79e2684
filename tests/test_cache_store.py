"""KernelStore: lookup rules, records, runs, steps, evaluations, misses (on SQLite and on PostgreSQL)."""

from __future__ import annotations

import pytest

from kernel_cache.errors import CacheError, NotFoundError
from kernel_cache.record import QUARANTINED, REJECTED, VERIFIED, StepRecord
from kernel_cache.store import KernelStore
from kernel_cache.testing import a100, h200, interpreter, make_problem, make_record
from kernel_cache.urls import default_db_url
from ks_core.fingerprint import MATCH_EXACT, MATCH_REVERIFY
from ks_inductor.judge.verdict import EvalResult, Timing


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """The same rules on both databases; the PostgreSQL one is a throwaway server (tests/postgres_server.py)."""
    url = str(tmp_path / "k.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    s = KernelStore(url)
    yield s
    s.close()


def test_one_reading_of_every_url_form(tmp_path, monkeypatch):
    """A path, a sqlite:/// URL, a PostgreSQL URL and any other SQLAlchemy URL are read once into a CacheURL that
    open_store takes as it is; the SQLite forms name the same file and open the same database."""
    from kernel_cache.access import open_store
    from kernel_cache.lazy_store import LazyKernelStore
    from kernel_cache.urls import parse_url

    monkeypatch.chdir(tmp_path)
    path = parse_url("k.db")
    assert (path.url, path.dialect, path.sqlite_file) == (f"sqlite:///{tmp_path / 'k.db'}", "sqlite", tmp_path / "k.db")
    assert parse_url(f"sqlite:///{tmp_path / 'k.db'}") == path
    assert parse_url("sqlite:///rel.db?timeout=5") == parse_url("sqlite:///rel.db?timeout=5")
    opts = parse_url("sqlite:///rel.db?timeout=5")
    assert opts.sqlite_file.name == "rel.db" and not opts.driver_only and path.driver_only
    assert parse_url("sqlite://").sqlite_file is None and parse_url("sqlite:///:memory:").sqlite_file is None
    pg = parse_url("postgres://ks:secret@db.example:5433/cache")
    assert pg.url == "postgresql+psycopg://ks:secret@db.example:5433/cache" and pg.postgres and pg.driver_only
    assert "secret" not in pg.where
    other = parse_url("mysql+pymysql://u@h/db")
    assert (other.dialect, other.sqlite_file, other.driver_only) == ("mysql", None, False)
    assert parse_url(path) is path
    with open_store(path) as full:
        assert full.location is path and full.where == str(tmp_path / "k.db")
    lazy = open_store(path, lazy=True)
    try:
        assert isinstance(lazy, LazyKernelStore) and lazy.fast and lazy.location is path
    finally:
        lazy.close()


def test_default_url_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELSMITH_DB", raising=False)
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    assert default_db_url() == f"sqlite:///{tmp_path / 'home' / 'kernels.db'}"
    monkeypatch.setenv("KERNELSMITH_DB", "sqlite:////elsewhere/x.db")
    assert default_db_url() == "sqlite:////elsewhere/x.db"
    monkeypatch.setenv("KERNELSMITH_DB", f"sqlite:///{tmp_path / 'env.db'}")
    with KernelStore() as s:
        assert s.where == str(tmp_path / "env.db")
    assert (tmp_path / "env.db").exists()


def test_lookup_picks_best_verified_and_ranks_by_lcb_then_time(store):
    fp = h200()
    store.add_kernel(make_record("p", "slow", fp, speedup_lcb=1.2, median_ms=2.0))
    best = store.add_kernel(make_record("p", "fast", fp, speedup_lcb=1.5, median_ms=1.5))
    store.add_kernel(make_record("p", "tie", fp, speedup_lcb=1.5, median_ms=1.7))
    store.add_kernel(make_record("p", "quarantined", fp, speedup_lcb=9.0, status=QUARANTINED))
    store.add_kernel(make_record("p", "rejected", fp, speedup_lcb=8.0, status=REJECTED))
    store.add_kernel(make_record("p", "no-lcb", fp, speedup_lcb=None, speedup_inductor=1.4, median_ms=0.1))
    store.add_kernel(make_record("other", "x", fp, speedup_lcb=5.0))
    assert store.lookup("p", fp).id == best
    assert store.lookup("missing", fp) is None
    # Without an lcb the Inductor speedup ranks the kernel: 1.4 sits below 1.5.
    ranked = [r.speedup_lcb or r.speedup_inductor for r, _ in store.lookup_candidates("p", fp)]
    assert ranked == [1.5, 1.5, 1.4, 1.2]


def test_fingerprint_rules(store):
    """Other torch/triton minors: only after re-verification. Other hardware: never. Interpreter: CPU only."""
    here, newer = h200(), h200(torch_version="2.12.1", triton_version="3.7.0")
    kid = store.add_kernel(make_record("p", "a", newer, speedup_lcb=3.0))
    assert store.lookup("p", here) is None
    assert [(r.id, m) for r, m in store.lookup_candidates("p", here)] == [(kid, MATCH_REVERIFY)]
    assert store.lookup("p", a100()) is None and store.lookup_candidates("p", a100()) == []
    # A patch release differs from the stored one only below the minor version: exact.
    assert store.lookup("p", h200(torch_version="2.12.0+cu130", triton_version="3.7.1")).id == kid

    cpu = store.add_kernel(make_record("q", "interp", interpreter(), timed=False, speedup_lcb=None))
    assert store.lookup("q", interpreter()).id == cpu
    assert store.lookup("q", here) is None
    # An untimed kernel somehow stored under a GPU fingerprint is still never served there.
    store.add_kernel(make_record("r", "untimed", here, timed=False))
    assert store.lookup("r", here) is None
    assert store.lookup_candidates("p", here)[0][1] == MATCH_REVERIFY
    assert store.lookup_candidates("q", interpreter())[0][1] == MATCH_EXACT


def test_memo_sees_writes_from_other_connections(tmp_path):
    url = str(tmp_path / "k.db")
    fp = h200()
    with KernelStore(url) as reader, KernelStore(url) as writer:
        assert reader.lookup("p", fp) is None
        a = writer.add_kernel(make_record("p", "a", fp, speedup_lcb=1.2))
        assert reader.lookup("p", fp).id == a  # the cached "no kernel" answer was dropped
        b = writer.add_kernel(make_record("p", "b", fp, speedup_lcb=1.9))
        assert reader.lookup("p", fp).id == b
        writer.set_status(b, QUARANTINED)
        assert reader.lookup("p", fp).id == a
        reader.set_status(a, REJECTED)
        assert reader.lookup("p", fp) is None
    with KernelStore(url, memo=False) as plain:
        assert plain.lookup("p", fp) is None


def test_add_kernel_identity_validation_and_status(store):
    fp = h200()
    rec = make_record("p", "a", fp, speedup_lcb=1.1)
    kid = store.add_kernel(rec)
    rec.speedup_lcb, rec.status = 1.3, QUARANTINED
    assert store.add_kernel(rec) == kid  # same source, key and fingerprint: the judge's newest verdict stands
    got = store.get_kernel(kid)
    assert (got.speedup_lcb, got.status, got.source, got.launch_params) == (1.3, QUARANTINED, rec.source,
                                                                            rec.launch_params)
    bad = make_record("p", "b", fp)
    bad.sha256 = "0" * 64
    with pytest.raises(CacheError, match="sha256"):
        store.add_kernel(bad)
    with pytest.raises(CacheError, match="unknown status"):
        store.add_kernel(make_record("p", "c", fp, status="great"))
    with pytest.raises(CacheError, match="fingerprint"):
        broken = make_record("p", "d", fp)
        broken.fingerprint = {"backend": "cuda"}
        store.add_kernel(broken)
    with pytest.raises(NotFoundError):
        store.set_status(9999, VERIFIED)
    with pytest.raises(NotFoundError):
        store.get_kernel(9999)
    assert [r.id for r in store.kernels(status=QUARANTINED)] == [kid]
    assert store.delete_kernels([kid]) == 1 and store.kernels() == []


def test_problems_evaluations_runs_steps_misses(store):
    p = make_problem()
    store.upsert_problem(p)
    p.name = "renamed"
    store.upsert_problem(p)
    assert store.get_problem(p.key) == p and store.get_problem("nope") is None

    fp = h200()
    run = store.start_run(p.key, fp, {"budget": 8})
    assert store.latest_run(p.key, fp) == run and store.latest_run(p.key, a100()) is None
    store.save_run_state(run, {"generation": 3, "archive": [1, 2]})
    assert store.load_run_state(run) == {"generation": 3, "archive": [1, 2]}

    res = EvalResult(correct=True, verdict="accepted", stage="done", fingerprint=fp.to_json(), problem_key=p.key,
                     candidate_hash="c1", timings={"candidate": Timing(0.5, 0.01, 0.49, 50)}, speedup_eager=2.0)
    store.add_evaluation(p.key, "c1", res, run_id=run)
    got = store.get_evaluation(p.key, "c1", fp.id)
    assert EvalResult.from_json(got).to_json() == res.to_json()
    assert store.get_evaluation(p.key, "c1", a100().id) is None
    with pytest.raises(NotFoundError):
        store.add_evaluation(p.key, "c1", res, run_id="no-such-run")

    step = StepRecord(run_id=run, problem_key=p.key, child_id="c1", mutation="llm-diff", parent_id="c0",
                      diff="-a\n+b", prompt="make it faster", response="```python\n...```", verdict="accepted",
                      correct=True, child_speedup=2.0, speedup_delta=0.5, feedback="ok", island=1,
                      tokens={"prompt": 10, "completion": 20})
    sid = store.add_step(step)
    [back] = store.steps(run_id=run)
    step.id = sid
    step.created_at = back.created_at
    assert back == step and store.steps(problem_key="other") == []
    with pytest.raises(NotFoundError):
        store.add_step(StepRecord(run_id="nope", problem_key=p.key, child_id="x", mutation="seed"))

    store.finish_run(run, {"best": 2.0})
    assert store.latest_run(p.key, fp) is None
    assert store.latest_run(p.key, fp, unfinished_only=False) == run

    store.record_miss(p, fp)
    store.record_miss(p, fp)
    [m] = store.misses()
    assert (m["key"], m["count"], m["shapes"], m["source"]) == (p.key, 2, [[4, 8]], p.source)

    s = store.stats()
    assert (s.problems, s.runs, s.evaluations, s.steps, s.misses) == (1, 1, 1, 1, 1)


def test_gc_plan_keeps_best_and_quarantined(store):
    fp = h200()
    ids = [store.add_kernel(make_record("p", f"v{i}", fp, speedup_lcb=1.0 + i / 10)) for i in range(5)]
    rej = store.add_kernel(make_record("p", "bad", fp, status=REJECTED))
    quar = store.add_kernel(make_record("p", "odd", fp, status=QUARANTINED))
    doomed = {r.id for r in store.gc_plan(keep=2)}
    assert doomed == {ids[0], ids[1], ids[2], rej}
    assert quar not in doomed


def test_generic_sqlalchemy_path(tmp_path):
    """Non-file URLs (a server database, or in-memory SQLite here) go through SQLAlchemy alone, without the memo
    and the direct SQLite reader."""
    fp = h200()
    with KernelStore("sqlite://") as s:
        assert not s._memo_enabled
        s.add_kernel(make_record("p", "a", fp, speedup_lcb=1.2))
        b = s.add_kernel(make_record("p", "b", fp, speedup_lcb=1.4))
        s.add_kernel(make_record("p", "c", a100(), speedup_lcb=3.0))
        assert s.lookup("p", fp).id == b and s.lookup("q", fp) is None
