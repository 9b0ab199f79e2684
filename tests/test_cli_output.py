"""Output that pipes: with ``--json`` stdout holds one JSON document and nothing else (progress and logs go to
stderr), and when stdout is not a terminal no table is cut and a kernel's source comes out as stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_cache.pack import ExportFilters, export_pack
from kernel_cache.store import KernelStore
from kernel_cache.testing import a100, make_problem, make_record
from ks_inductor.catalogue.models import NORM_FACTORY
from ks_inductor.cli import main
from ks_inductor.warm import WarmItem, WarmSummary
from tests.cli_home import _isolated  # noqa: F401 - autouse: a kernelsmith home per test

# A kernel whose source has lines far wider than a terminal's 80 columns.
LONG_TAG = "a docstring line much wider than any terminal " * 4


@pytest.fixture
def cache(tmp_path) -> tuple[str, int, str]:
    """A cache with one verified kernel for an A100 (a long device name) whose source has long lines: (the
    database, the kernel's id, its source)."""
    db = str(tmp_path / "k.db")
    problem = make_problem()
    with KernelStore(db) as store:
        store.upsert_problem(problem)
        record = make_record(problem.key, LONG_TAG, a100())
        kid = store.add_kernel(record)
    return db, kid, record.source


def _no_cut(text: str) -> None:
    assert "…" not in text and "..." not in text, text


def test_progress_goes_to_stderr(capsys):
    from ks_inductor.evolve.evolver import _Bar

    bar = _Bar(True, "rmsnorm", 3, 0)
    bar.advance()
    bar.close()
    out = capsys.readouterr()
    assert out.out == "" and "rmsnorm" in out.err


def test_json_is_alone_on_stdout(tmp_path, cache, capsys):
    db, kid, _ = cache
    (tmp_path / "factory.py").write_text(NORM_FACTORY)
    pack = str(tmp_path / "p.kspack")
    for argv in (["cache", "ls", "--db", db], ["cache", "show", str(kid), "--db", db], ["cache", "stats", "--db", db],
                 ["pack", "export", "-o", pack, "--db", db, "--no-vectors"], ["pack", "inspect", pack],
                 ["explain", f"{tmp_path / 'factory.py'}:make", "--db", db],
                 ["export-trajectories", "-o", str(tmp_path / "t.jsonl"), "--db", db]):
        assert main([*argv, "--json"]) == 0, argv
        json.loads(capsys.readouterr().out)  # the whole of stdout is one document


def test_tables_are_not_cut_when_stdout_is_not_a_terminal(tmp_path, cache, capsys):
    db, kid, _ = cache
    assert main(["cache", "ls", "--db", db]) == 0
    out = capsys.readouterr().out
    _no_cut(out)
    assert "NVIDIA A100-SXM4-80GB (cuda)" in out and "verified" in out
    pack = str(tmp_path / "p.kspack")
    with KernelStore(db) as store:
        export_pack(store, pack, ExportFilters(), vectors=False)
    assert main(["pack", "inspect", pack]) == 0
    out = capsys.readouterr().out
    _no_cut(out)
    assert "NVIDIA A100-SXM4-80GB (cuda)" in out and "2.11.0+cu130/3.6.0" in out


def test_warm_table_is_not_cut_when_stdout_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    import ks_inductor.warm as W

    name = "rmsnorm_with_a_long_region_name"
    summary = WarmSummary(items=[WarmItem(key="k" * 32, name=name, origin="kernelbench",
                                          signature="float32[64, 256], float32[256]", status="found", judged=4,
                                          accepted=2, timed=False)])
    monkeypatch.setattr(W, "warm", lambda *a, **k: summary)
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "rmsnorm.py").write_text((Path(__file__).parent / "problems" / "rmsnorm.py").read_text())
    assert main(["warm", "--kernelbench", str(folder), "--db", str(tmp_path / "k.db")]) == 0
    out = capsys.readouterr().out
    _no_cut(out)
    assert name in out and "float32[64, 256], float32[256]" in out and "untimed" in out


def test_cache_show_prints_the_source_as_stored(cache, capsys):
    db, kid, source = cache
    assert max(len(line) for line in source.splitlines()) > 120
    assert main(["cache", "show", str(kid), "--db", db]) == 0
    out = capsys.readouterr().out
    assert source in out
    assert main(["cache", "show", str(kid), "--db", db, "--no-source"]) == 0
    assert "_copy_kernel" not in capsys.readouterr().out


def test_a_kernels_judged_plan_is_summed_up_for_a_person_and_flagged_in_ls(tmp_path, capsys):
    """``cache show`` tells a person what a kernel's judged plan launches (its JSON is for ``--json``), and
    ``cache ls --json`` says whether each kernel has one without carrying it."""
    view = {"storage": 0, "offset": 0, "shape": [4, 8], "stride": [8, 1], "dtype": "float32"}
    out = {**view, "storage": 1}
    launch = {"op": "launch", "kernel": "_copy_kernel", "grid": [1, 1, 1],
              "args": {"x_ptr": {"t": view}, "out_ptr": {"t": out}, "n": {"v": 32}, "BLOCK": {"v": 1024}}}
    plan = json.dumps({"version": 1, "storages": [{"kind": "input", "index": 0, "nbytes": 128},
                                                  {"kind": "alloc", "nbytes": 128}],
                       "steps": [launch, {"op": "fill", "dst": out, "value": 0.0}, launch], "outputs": [out]})
    db = str(tmp_path / "k.db")
    problem = make_problem()
    with KernelStore(db) as store:
        store.upsert_problem(problem)
        with_plan = store.add_kernel(make_record(problem.key, "planned", a100(), plan=plan))
        without = store.add_kernel(make_record(problem.key, "forward", a100()))
    assert main(["cache", "show", str(with_plan), "--db", db, "--no-source"]) == 0
    out = capsys.readouterr().out
    assert "judged plan: 2 launch(es) of _copy_kernel, 3 step(s)" in out and '"steps"' not in out
    assert main(["cache", "show", str(without), "--db", db, "--no-source"]) == 0
    assert "none: it serves from its forward" in capsys.readouterr().out
    assert main(["cache", "ls", "--db", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"]: r["judged_plan"] for r in rows} == {with_plan: True, without: False}
    assert all("plan" not in r for r in rows)
