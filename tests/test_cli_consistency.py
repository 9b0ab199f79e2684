"""The ``kernelsmith`` command as a user meets it: a version, help for every argument, one meaning per flag,
one-line errors with exit code 2, read-only commands that create nothing, and an ``explain`` that tells what a
compile in the same environment would do. CPU only; nothing here judges a kernel."""

import argparse
import textwrap
import types
from pathlib import Path

import pytest
import torch

import ks_inductor
from kernel_cache.store import KernelStore
from kernel_cache.testing import make_record
from ks_inductor.catalogue.models import NORM_FACTORY
from ks_inductor.cli import build_parser, main
from ks_inductor.cli.args import DB_HELP
from ks_inductor.compiler import backend as B
from ks_inductor.warm import WarmSummary
from tests.cli_home import _isolated  # noqa: F401 - autouse: a kernelsmith home per test
from tests.cli_parsing import actions, commands, one_line_error

PROBLEMS = Path(__file__).resolve().parent / "problems"

# The warm tests' factory (a small norm model), with one more function that fails.
FACTORY = NORM_FACTORY + textwrap.dedent("""


    def boom():
        raise RuntimeError("the factory itself failed")
""")


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "factory.py"
    path.write_text(FACTORY)
    return str(path)


# ------------------------------------------------------------------ version and help


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kernelsmith {ks_inductor.__version__}"


def test_every_argument_of_every_command_has_help():
    missing = []
    for path, p in commands(build_parser()):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (a.help or "").strip():
                missing.append(f"kernelsmith {' '.join(path)} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, "arguments without help: " + ", ".join(missing)


def _bench_parser() -> argparse.ArgumentParser:
    """``kernelsmith bench`` hands its arguments to the repository's benchmark runner: this is that runner's parser."""
    from benchmarks.run import add_arguments

    p = argparse.ArgumentParser(prog="python -m benchmarks.run")
    add_arguments(p)
    return p


def test_bench_lists_only_suites_that_exist():
    from benchmarks.config import SUITES

    suite = next(a for a in _bench_parser()._actions if "--suite" in a.option_strings)
    assert set(suite.choices) == set(SUITES)
    assert "model" not in suite.choices


def test_bench_and_report_pass_every_argument_to_the_benchmark_programs():
    parsed = build_parser().parse_args(["bench", "--suite", "llm-ops", "--help"])
    assert (parsed.program, parsed.argv) == ("run", ["--suite", "llm-ops", "--help"])
    parsed = build_parser().parse_args(["report", "r.json", "--no-plots"])
    assert (parsed.program, parsed.argv) == ("report", ["r.json", "--no-plots"])


# ------------------------------------------------------------------ one flag, one meaning


def test_db_has_one_description_everywhere():
    found = list(actions("--db"))
    commands = {p for p, _ in found}
    assert {("evolve",), ("warm",), ("explain",), ("cache", "ls"), ("export-trajectories",)} <= commands
    found += [(("bench",), a) for a in _bench_parser()._actions if "--db" in a.option_strings]
    assert {(a.help, a.metavar) for _, a in found} == {(DB_HELP, "URL")}


def test_budget_and_time_limit_mean_the_same_in_evolve_and_warm():
    budget = dict(actions("--budget"))
    limit = dict(actions("--time-limit"))
    assert set(budget) == set(limit) == {("evolve",), ("warm",), ("pack", "export")}
    assert budget[("evolve",)].help.startswith("candidates judged per problem")
    assert budget[("warm",)].help.startswith("candidates judged per region")
    assert budget[("pack", "export")].help.startswith("candidates judged per layer problem")
    for a in limit.values():
        assert a.metavar == "SECONDS" and "in seconds" in a.help
    total = dict(actions("--total-time"))
    assert total[("warm",)].metavar == "SECONDS"


def test_evolve_time_limit_is_seconds_and_old_minutes_still_work(tmp_path, capsys, monkeypatch):
    import ks_inductor.evolve.evolver as evolver

    seen = []

    def fake_evolve(problem, config, store, judge=None, progress=True):
        seen.append(config.time_limit_s)
        raise evolver.EvolveError("stop here")

    monkeypatch.setattr(evolver, "evolve_problem", fake_evolve)
    db = str(tmp_path / "k.db")
    problem = str(PROBLEMS / "rmsnorm.py")
    assert main(["evolve", problem, "--db", db, "--time-limit", "30"]) == 2
    assert capsys.readouterr().err.count("deprecated") == 0
    assert main(["evolve", problem, "--db", db, "--time", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if "deprecated" in line] == [
        "kernelsmith: --time MIN is deprecated; use --time-limit SECONDS (taken as --time-limit 120)"]
    # The new spelling wins over the old one, whatever their order.
    assert main(["evolve", problem, "--db", db, "--time-limit", "45", "--time", "2"]) == 2
    assert seen == [30.0, 120.0, 45.0]
    assert main(["evolve", problem, "--db", db, "--budget", "0"]) == 2


def test_warm_takes_a_limit_per_region_and_for_the_whole_run(tmp_path, capsys, monkeypatch):
    import ks_inductor.warm as W

    calls = []

    def fake_warm(problems, store, config, force=False, console=None, origin="model", total_time_s=None,
                  executor=None):
        calls.append((config.budget, config.time_limit_s, total_time_s))
        return WarmSummary()

    monkeypatch.setattr(W, "warm", fake_warm)
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "rmsnorm.py").write_text((PROBLEMS / "rmsnorm.py").read_text())
    args = ["warm", "--kernelbench", str(folder), "--db", str(tmp_path / "k.db"), "--json"]
    assert main([*args, "--budget", "4", "--time-limit", "20", "--total-time", "90"]) == 0
    (budget, per_region, total), = calls
    assert (budget, per_region) == (4, 20.0)
    assert 80.0 < total <= 90.0  # counted from the command's start: reading the folder took some of it


def test_warm_whole_run_limit_caps_each_region_and_skips_the_rest(monkeypatch):
    """The library side of ``--total-time``: each key's search gets at most what is left of the run."""
    import ks_inductor.evolve as E
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.problem_tracing import load_problem
    from ks_inductor.warm import warm

    class _Result:
        judged, accepted = 1, 0
        why = note = ""

        def to_json(self):
            return {"judged": self.judged, "accepted": self.accepted}

    class _Store:
        def lookup(self, key, fp):
            return None

    class _Judge:
        fingerprint = B.current_fingerprint("triton-interpret")
        backend = types.SimpleNamespace(device="cpu")

    limits = []

    def fake_evolve(problem, config, store, judge=None, progress=True):
        limits.append(config.time_limit_s)
        return _Result()

    monkeypatch.setattr(E, "evolve_problem", fake_evolve)
    problems = [load_problem(PROBLEMS / "rmsnorm.py"), load_problem(PROBLEMS / "tiny_output.py")]
    assert problems[0].key != problems[1].key
    summary = warm(problems, _Store(), EvolveConfig(time_limit_s=1000.0, inductor_seeds=False), judge=_Judge(),
                   total_time_s=60.0)
    assert len(limits) == 2 and all(0 < t <= 60.0 for t in limits)
    assert [i.status for i in summary.items] == ["no-kernel", "no-kernel"]

    limits.clear()
    summary = warm(problems, _Store(), EvolveConfig(time_limit_s=5.0, inductor_seeds=False), judge=_Judge(),
                   total_time_s=60.0)
    assert limits == [5.0, 5.0]  # the per-region limit is the tighter one

    limits.clear()
    summary = warm(problems, _Store(), EvolveConfig(inductor_seeds=False), judge=_Judge(), total_time_s=1e-9)
    assert limits == [] and [i.status for i in summary.items] == ["not-run", "not-run"]


# ------------------------------------------------------------------ user mistakes: one line, exit 2


def test_factory_mistakes_are_one_line_errors(tmp_path, factory, capsys):
    db = str(tmp_path / "k.db")
    assert main(["explain", f"{factory}:boom", "--db", db]) == 2
    assert "the factory itself failed" in one_line_error(capsys)
    assert main(["warm", f"{factory}:boom", "--db", db]) == 2
    assert "the factory itself failed" in one_line_error(capsys)
    assert main(["explain", f"{factory}:no_such_function", "--db", db]) == 2
    assert "no_such_function" in one_line_error(capsys)
    assert main(["explain", "no_such_module_xyz:make", "--db", db]) == 2
    assert "no_such_module_xyz" in one_line_error(capsys)
    assert main(["explain", str(tmp_path / "missing.py") + ":make", "--db", db]) == 2
    one_line_error(capsys)
    # None of these opened, let alone created, the cache.
    assert not (tmp_path / "k.db").exists()


def test_missing_files_are_one_line_errors(tmp_path, capsys):
    db = str(tmp_path / "k.db")
    assert main(["evolve", str(tmp_path / "missing.py"), "--db", db]) == 2
    assert "missing.py" in one_line_error(capsys)
    assert main(["eval", str(tmp_path / "missing.py"), str(PROBLEMS / "rmsnorm.py")]) == 2
    one_line_error(capsys)
    assert main(["warm", "--kernelbench", str(tmp_path / "no_folder"), "--db", db]) == 2
    assert "no_folder" in one_line_error(capsys)


def test_bad_database_urls_are_one_line_errors(tmp_path, factory, capsys):
    for argv in (["cache", "ls"], ["cache", "stats"], ["explain", f"{factory}:make"],
                 ["export-trajectories", "-o", str(tmp_path / "t.jsonl")]):
        assert main([*argv, "--db", "nosuchdialect://host/db"]) == 2, argv
        assert "nosuchdialect" in one_line_error(capsys)


# ------------------------------------------------------------------ read-only commands create nothing


READ_ONLY = [["cache", "ls"], ["cache", "ls", "--json"], ["cache", "stats"], ["cache", "stats", "--json"],
             ["cache", "gc", "--dry-run"]]


def test_read_only_commands_refuse_a_named_cache_that_is_not_there(tmp_path, factory, capsys):
    """A mistyped --db (a folder that does not exist, or a file that does not) is an error, never an empty cache."""
    for url in (f"sqlite:///{tmp_path / 'missing' / 'folder' / 'x.db'}", str(tmp_path / "typo.db")):
        for argv in (*READ_ONLY, ["cache", "show", "1"], ["cache", "rm", "1"], ["explain", f"{factory}:make"],
                     ["export-trajectories", "-o", str(tmp_path / "t")], ["pack", "export", "-o", str(tmp_path / "p")]):
            assert main([*argv, "--db", url]) == 2, (argv, url)
            assert "no kernel cache at" in one_line_error(capsys), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["factory.py"]


def test_read_only_commands_on_the_default_cache_before_anything_is_stored(tmp_path, factory, capsys):
    home = tmp_path / "home"  # KERNELSMITH_HOME (the _isolated fixture), not made yet
    for argv in READ_ONLY:
        assert main(argv) == 0, argv
        out = capsys.readouterr()
        assert out.err.strip() == f"no kernel cache at {home / 'kernels.db'}; nothing is stored yet"
        if argv == ["cache", "ls", "--json"]:
            assert out.out.strip() == "[]"
    assert main(["explain", f"{factory}:make"]) == 0
    out = capsys.readouterr()
    assert f"no kernel cache at {home / 'kernels.db'}" in out.err and "0 hits, 1 misses" in out.out
    # Asking for something specific in a cache that is not there is a mistake in what was asked.
    for argv in (["cache", "show", "1"], ["cache", "rm", "1"], ["export-trajectories", "-o", str(tmp_path / "t")],
                 ["pack", "export", "-o", str(tmp_path / "p.kspack")]):
        assert main(argv) == 2, argv
        assert "no kernel cache at" in one_line_error(capsys)
    assert not (home / "kernels.db").exists()


def test_a_cache_that_exists_is_still_listed(tmp_path, capsys):
    db = str(tmp_path / "k.db")
    KernelStore(db).close()
    assert main(["cache", "ls", "--db", db]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "no kernels match" in out.out


# ------------------------------------------------------------------ explain tells what a compile would do


def _cache_with_interpreter_kernel(tmp_path, factory) -> str:
    """A cache holding a verified interpreter kernel for the factory's one region."""
    from ks_inductor.compiler.explain import explain
    from ks_inductor.warm import load_factory

    db = str(tmp_path / "k.db")
    KernelStore(db).close()
    model, inputs = load_factory(f"{factory}:make")
    problem = explain(model, *inputs, db=db).problems[0]
    fp = B.current_fingerprint(None)
    assert fp.backend == "cpu-interpret"
    with KernelStore(db) as store:
        store.upsert_problem(problem)
        # A plan of some kernel: explain reads whether a record has one, and runs nothing.
        store.add_kernel(make_record(problem.key, "interp", fp, timed=False, median_ms=None, speedup_lcb=None,
                                     plan='{"steps": []}'))
    B.forget_stores()
    torch._dynamo.reset()
    return db


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter rule is about machines without a GPU")
def test_explain_hit_for_cpu_kernels_only_under_the_interpreter(tmp_path, factory, capsys, monkeypatch):
    import json

    db = _cache_with_interpreter_kernel(tmp_path, factory)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main(["explain", f"{factory}:make", "--db", db, "--json"]) == 0
    on = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (on["hits"], on["misses"]) == (1, 0)

    torch._dynamo.reset()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert main(["explain", f"{factory}:make", "--db", db, "--json"]) == 0
    off = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    region = off["graphs"][0]["regions"][0]
    assert off["hits"] == 0 and region["status"] == B.UNUSABLE and "TRITON_INTERPRET=1" in region["note"]


def test_explain_and_the_backend_share_one_serving_rule(tmp_path, factory, capsys, monkeypatch):
    """explain asks the backend's own rule (not a copy of it) whether a cached kernel can run here."""
    import json

    db = _cache_with_interpreter_kernel(tmp_path, factory)
    monkeypatch.setattr(B, "unrunnable_reason", lambda device, record=None: "a reason only this test gives")
    assert main(["explain", f"{factory}:make", "--db", db, "--json"]) == 0
    region = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["graphs"][0]["regions"][0]
    assert region["status"] == B.UNUSABLE and "a reason only this test gives" in region["note"]


# ------------------------------------------------------------------ readable names


def test_messages_name_operations_not_reprs(tmp_path):
    import operator

    from ks_inductor.problem_tracing import load_problem, op_label

    assert op_label(operator.getitem) == "operator.getitem"
    assert op_label(torch.ops.aten.add.Tensor) == "add"
    assert op_label(torch.rsqrt) == "torch.rsqrt"
    prob = tmp_path / "argmax.py"
    prob.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x):
                v, i = torch.max(x, dim=-1)
                return v * 2, i


        def get_inputs():
            return [torch.randn(8, 32)]


        def get_init_inputs():
            return []
    """))
    ops = load_problem(prob).op_summary
    assert "operator.getitem" in ops and not any("<" in k for k in ops)
