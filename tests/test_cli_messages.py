"""Help and messages that agree with what the commands do: one spelling per flag, every default shown, errors that
name only flags the command takes, counts that add up, and files written only where asked, with ordinary modes."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
from pathlib import Path

import pytest

from ks_core.settings import Settings
from ks_inductor.catalogue import PROBLEM_DIR
from ks_inductor.cli import build_parser, main
from ks_inductor.cli.args import HelpFormatter, dtype_name
from tests.cli_home import _isolated  # noqa: F401 - autouse: a kernelsmith home per test
from tests.cli_parsing import actions, commands, one_line_error

ROOT = Path(__file__).resolve().parent.parent


def _program_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """The parsers of the benchmark programs ``kernelsmith bench`` and ``kernelsmith report`` hand over to."""
    from benchmarks.report import build_parser as report_parser
    from benchmarks.run import add_arguments

    run = argparse.ArgumentParser(prog="python -m benchmarks.run", formatter_class=HelpFormatter)
    add_arguments(run)
    return [("bench", run), ("report", report_parser())]


def _all_parsers():
    yield from ((" ".join(path), p) for path, p in commands(build_parser()) if path not in (("bench",), ("report",)))
    yield from _program_parsers()


# ------------------------------------------------------------------ help


def test_every_help_shows_every_default():
    missing = []
    for name, p in _all_parsers():
        assert p.formatter_class is HelpFormatter, name
        formatter = p._get_formatter()
        for a in p._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or a.nargs == 0 or a.required:
                continue
            if "default" not in formatter._get_help_string(a):
                missing.append(f"{name} {'/'.join(a.option_strings)}")
    assert not missing, "help without its default: " + ", ".join(missing)


def test_warm_help_says_how_many_regions_are_searched_at_once(capsys):
    from ks_inductor.warm.parallel import REGIONS_PER_GPU

    with pytest.raises(SystemExit):
        build_parser().parse_args(["warm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{REGIONS_PER_GPU} per local GPU, 2 on a CPU" in text
    assert "one per local GPU" not in text and "one region per GPU" not in text


def test_errors_name_only_flags_the_command_takes(tmp_path, capsys):
    for command in ("warm", "explain"):
        assert main([command, "--db", str(tmp_path / "k.db")]) == 2
        err = one_line_error(capsys)
        flags = set(re.findall(r"--[a-z][a-z-]+", err))
        takes = {o for a in next(p for path, p in commands(build_parser()) if path == (command,))._actions
                 for o in a.option_strings}
        assert flags and flags <= takes, (command, flags - takes)
    assert main(["explain"]) == 2
    err = one_line_error(capsys)
    assert "--from-misses" not in err and "--kernelbench" not in err and "--hf-config" in err


# ------------------------------------------------------------------ one spelling, one meaning


def test_one_spelling_per_flag():
    def helps(flag):
        return {path: a for path, a in actions(flag)}

    keys = helps("--key")
    assert set(keys) == {("cache", "ls"), ("pack", "export"), ("export-trajectories",)}
    assert {a.help.split(" of this problem key")[1] for a in keys.values()} == {"; a prefix of one is enough (repeatable; default: all)"}
    assert not list(actions("--problem-key"))
    for flag in ("--hf-config", "--hf-set", "--batch", "--seq", "--dtype", "--device"):
        found = helps(flag)
        assert set(found) == {("warm",), ("explain",), ("pack", "export")}, flag
        assert len({(a.help, a.type, type(a).__name__, a.default) for a in found.values()}) == 1, flag
    assert helps("--batch")[("warm",)].__class__.__name__ == "_AppendAction"
    assert {path: a.help for path, a in helps("--for").items()} == {("pack", "export"): argparse.SUPPRESS}
    budgets = helps("--budget")
    assert {a.default for a in budgets.values()} == {Settings().budget}
    assert not list(actions("--evolve-budget")) and not list(actions("--dtypes"))


def test_the_benchmark_runner_spells_its_flags_like_the_commands():
    run = dict(_program_parsers())["bench"]
    by_flag = {o: a for a in run._actions for o in a.option_strings}
    warm = {o: a for path, p in commands(build_parser()) if path == ("warm",) for a in p._actions
            for o in a.option_strings}
    for flag in ("--kernelbench", "--levels", "--problems", "--db", "-v"):
        assert by_flag[flag].help == warm[flag].help, flag
        assert flag == "-v" or by_flag[flag].default == warm[flag].default, flag
    assert by_flag["--dtype"].type is dtype_name and by_flag["--dtypes"].help == argparse.SUPPRESS
    assert "--evolve-budget" not in by_flag and by_flag["--budget"].dest == "evolve_budget"
    args = run.parse_args(["--suite", "llm-ops", "--dtype", "bf16", "--dtype", "float16", "--budget", "3"])
    assert (args.dtypes, args.evolve_budget) == (["bfloat16", "float16"], 3)


def test_dtype_names():
    assert dtype_name("bf16") == dtype_name("bfloat16") == dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name("fp32") == "float32" and dtype_name("half") == "float16"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown dtype"):
        dtype_name("nn")


def test_v_goes_before_or_after_the_command(tmp_path, capsys):
    parser = build_parser()
    for argv, level in ((["-v", "cache", "ls"], 1), (["cache", "ls", "-vv"], 2), (["cache", "-v", "ls", "-v"], 1),
                        (["-v", "warm", "m:f", "-v"], 2)):
        args = parser.parse_args(argv)
        assert args.verbose + getattr(args, "sub_verbose", 0) == level, argv
    db = str(tmp_path / "k.db")
    from kernel_cache.store import KernelStore

    KernelStore(db).close()
    assert main(["cache", "ls", "--db", db, "-v"]) == 0


# ------------------------------------------------------------------ counts that add up


def test_a_second_evolve_counts_its_judgments_and_the_verdicts_it_reused(tmp_path, capsys):
    problem = str(PROBLEM_DIR / "cpu" / "rmsnorm_small.py")
    db = str(tmp_path / "k.db")
    argv = ["evolve", problem, "--backend", "triton-interpret", "--budget", "2", "--db", db]
    assert main([*argv, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["reused"] == 0 and first["accepted"] <= first["judged"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    judged = int(re.search(r"judgments\s*│?\s*(\d+)", text).group(1))
    reused = int(re.search(r"and (\d+) verdicts of earlier runs reused", text).group(1))
    accepted, of = map(int, re.search(r"accepted\s*│?\s*(\d+) of (\d+)", text).groups())
    assert reused >= 1 and of == judged and accepted <= judged, text


# ------------------------------------------------------------------ files: only where asked, ordinary modes


def test_report_through_the_command_writes_nothing_unless_asked(tmp_path, capfd):
    from tests.bench_results import synthetic

    path = synthetic().save(tmp_path / "llm-ops-h200.json")
    assert main(["report", str(path), "--no-plots"]) == 0
    assert capfd.readouterr().out.startswith("# ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-ops-h200.json"]
    assert main(["report", str(path), "--no-plots", "-o", str(tmp_path / "r.md")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-ops-h200.json", "r.md"]


def test_bench_and_report_help_name_the_command_that_ran_them(capfd):
    for command in ("bench", "report"):
        assert main([command, "--help"]) == 0
        out = capfd.readouterr().out
        assert out.startswith(f"usage: kernelsmith {command} ") and "benchmarks." not in out.splitlines()[0], out


def test_packs_are_written_with_the_umask_mode(tmp_path):
    from kernel_cache.pack import ExportFilters, export_pack
    from kernel_cache.store import KernelStore
    from kernel_cache.testing import make_problem, make_record

    db = str(tmp_path / "k.db")
    with KernelStore(db) as store:
        problem = make_problem()
        store.upsert_problem(problem)
        store.add_kernel(make_record(problem.key, "a"))
        old = os.umask(0o022)
        try:
            export_pack(store, tmp_path / "p.kspack", ExportFilters(), vectors=False)
            (tmp_path / "plain").write_text("x")
        finally:
            os.umask(old)
    mode = stat.S_IMODE((tmp_path / "p.kspack").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644


def test_the_demo_leaves_no_folder_behind(tmp_path, monkeypatch):
    import tempfile

    import ks_inductor.demo as demo

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen = []
    homes = []

    def run(db, budget):
        import os

        path = Path(db.removeprefix("sqlite:///"))
        path.write_text("")
        seen.append(path)
        homes.append(os.environ.get("KERNELSMITH_HOME"))
        homes.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        return 0

    monkeypatch.setattr(demo, "run", run)
    # With no home named, the demo's graph analyses, modules and Inductor's cache go to its temporary folder too.
    monkeypatch.delenv("KERNELSMITH_HOME", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert demo.main(["--budget", "1"]) == 0
    assert seen and seen[0].parent.parent == scratch
    assert homes[0] and homes[1] and Path(homes[0]).parent == Path(homes[1]).parent == seen[0].parent
    assert list(scratch.iterdir()) == []
    assert not {"KERNELSMITH_HOME", "TORCHINDUCTOR_CACHE_DIR"} & set(__import__("os").environ)
    assert demo.main(["--db", str(tmp_path / "mine.db")]) == 0 and seen[-1] == tmp_path / "mine.db"


def test_the_demo_prints_its_table_whole_to_a_pipe():
    import io

    from rich.console import Console
    from rich.table import Table

    from ks_inductor.demo import print_uncut

    table = Table("region", "operations", "why")
    table.add_row("gemm_gelu-bf16-decode", "mm, add, gelu " * 6, "no verified kernel in the cache for this key " * 2)
    piped = Console(file=io.StringIO())  # not a terminal: rich would take 80 columns
    print_uncut(piped, table)
    text = piped.file.getvalue()
    assert "…" not in text and "gemm_gelu-bf16-decode" in text and max(map(len, text.splitlines())) > 80, text
