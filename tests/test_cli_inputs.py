"""Inputs checked before anything runs: every number the commands take, a model too large to build here, a pack that
is not there; and exit codes that mean the same in every command (0 done, 1 found nothing, 2 usage)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from ks_inductor.cli import build_parser, main
from ks_inductor.cli.args import nonnegative_float, nonnegative_int, positive_float, positive_int
from ks_inductor.warm import WarmItem, WarmSummary
from tests.cli_home import _isolated  # noqa: F401 - autouse: a kernelsmith home per test
from tests.cli_parsing import commands, one_line_error

PROBLEMS = Path(__file__).resolve().parent / "problems"
CHECKED = {positive_int, positive_float, nonnegative_int, nonnegative_float}


def test_every_number_a_command_takes_is_checked():
    unchecked = []
    for path, p in commands(build_parser()):
        for a in p._actions:
            numeric_default = isinstance(a.default, (int, float)) and not isinstance(a.default, bool)
            if (a.type in (int, float) or (numeric_default and a.nargs != 0)) and a.type not in CHECKED:
                unchecked.append(f"kernelsmith {' '.join(path)} {'/'.join(a.option_strings) or a.dest}")
    assert not unchecked, "numbers taken without a check: " + ", ".join(unchecked)


@pytest.mark.parametrize("argv", [
    ["warm", "--hf-config", "llama", "--seq", "0"],
    ["explain", "--hf-config", "llama", "--batch", "-2"],
    ["pack", "export", "--hf-config", "llama", "--seq", "0", "-o", "p.kspack"],
    ["cache", "gc", "--keep", "-1"],
    ["cache", "gc", "--keep", "0"],
    ["cache", "ls", "--limit", "0"],
    ["cache", "show", "-3"],
    ["evolve", "p.py", "--budget", "-5"],
    ["evolve", "p.py", "--time-limit", "-1"],
    ["evolve", "p.py", "--time-limit", "nan"],
    ["evolve", "p.py", "--parallel", "0"],
    ["evolve", "p.py", "--llm-timeout", "0"],
    ["warm", "m:f", "--total-time", "0"],
    ["warm", "m:f", "--parallel-regions", "0"],
    ["warm", "--kernelbench", "kb", "--levels", "0"],
    ["eval", "p.py", "c.py", "--trials", "0"],
    ["export-trajectories", "-o", "t.jsonl", "--min-gain", "-0.1"],
    ["pack", "export", "-o", "p.kspack", "--min-speedup", "-1"],
])
def test_a_bad_number_is_a_one_line_error(argv, capsys):
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert err.startswith("error: kernelsmith ") and "argument" in err and "--help" in err, err


def test_numbers_at_their_lowest_are_taken():
    parser = build_parser()
    assert parser.parse_args(["cache", "gc", "--keep", "1"]).keep == 1
    assert parser.parse_args(["export-trajectories", "-o", "t", "--min-gain", "0"]).min_gain == 0.0
    assert parser.parse_args(["warm", "m:f", "--seed", "0", "--budget", "1"]).budget == 1


# ------------------------------------------------------------------ a model too large to build here


def test_a_model_that_cannot_fit_is_refused_before_it_is_built(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import transformers

    from ks_inductor.warm import sources

    def never(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", never)
    monkeypatch.setattr(sources, "available_memory", lambda device: 4 * 2**30)
    for command in ("warm", "explain"):
        assert main([command, "--hf-config", "llama", "--db", str(tmp_path / "k.db")]) == 2
        err = one_line_error(capsys)
        # Llama's defaults: 4096 hidden, 32 layers, a 32000 vocabulary: about 6.7B parameters.
        assert "llama: about 6.7" in err and "B parameters" in err and "GiB is available" in err, err
        assert "--hf-set num_hidden_layers=" in err
    assert not (tmp_path / "k.db").exists()


HF_SMALL = ["--hf-config", "llama", "--hf-set", "hidden_size=64", "--hf-set", "intermediate_size=128",
            "--hf-set", "num_attention_heads=4", "--hf-set", "num_key_value_heads=2", "--hf-set", "vocab_size=128"]


def test_a_mistyped_config_key_or_model_type_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import transformers

    def never(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", never)
    db = str(tmp_path / "k.db")
    assert main(["explain", *HF_SMALL, "--hf-set", "num_hiden_layers=1", "--seq", "2", "--db", db]) == 2
    err = one_line_error(capsys)
    assert "--hf-set num_hiden_layers" in err and "closest: num_hidden_layers" in err, err
    assert main(["warm", *HF_SMALL, "--hf-set", "hidden_sise=64", "--db", db]) == 2
    err = one_line_error(capsys)
    assert "hidden_sise" in err and "hidden_size" in err and "parameters" not in err, err
    assert main(["explain", "--hf-config", "llamaa", "--db", db]) == 2
    err = one_line_error(capsys)
    assert "--hf-config 'llamaa'" in err and "closest: llama" in err and len(err) < 200, err


def test_config_fields_spelled_right_are_taken():
    pytest.importorskip("transformers")
    import transformers

    from ks_inductor.warm.sources import check_config_keys

    cfg = transformers.AutoConfig.for_model("llama")
    # a field, a field of rope_parameters, and an argument the constructor keeps under a private name
    check_config_keys(cfg, {"num_hidden_layers": 1, "rope_theta": 5.0, "attn_implementation": "eager"})


def test_the_size_estimate_and_what_fits():
    pytest.importorskip("transformers")
    import transformers

    from ks_inductor.warm.sources import WarmError, check_fits, param_counts

    cfg = transformers.AutoConfig.for_model("llama")
    outside, per_layer, layers = param_counts(cfg)
    assert 6.5e9 < outside + per_layer * layers < 6.9e9  # Llama 2 7B's sizes: 6.74B parameters
    small = transformers.AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    check_fits("small", small, torch.float32, "cpu")  # fits anywhere
    import ks_inductor.warm.sources as S

    real = S.available_memory
    try:
        S.available_memory = lambda device: 8 * 2**30
        with pytest.raises(WarmError, match=r"--hf-set num_hidden_layers=(\d+)") as e:
            check_fits("llama", cfg, torch.bfloat16, "cpu")
        # what the message offers fits: a float32 build and a bfloat16 copy, 6 bytes a parameter
        fits = int(str(e.value).rsplit("num_hidden_layers=", 1)[1])
        assert fits >= 1
        assert (outside + per_layer * fits) * 6 <= 0.6 * 8 * 2**30 < (outside + per_layer * (fits + 1)) * 6
        S.available_memory = lambda device: 1 * 2**30  # not even the embeddings: smaller sizes
        with pytest.raises(WarmError, match="smaller hidden_size, intermediate_size and vocab_size"):
            check_fits("llama", cfg, torch.float32, "cpu")
    finally:
        S.available_memory = real
    assert param_counts(types.SimpleNamespace(hidden_size=64, num_hidden_layers=2)) is None  # no vocabulary


# ------------------------------------------------------------------ files that are not there


def test_pack_commands_say_first_that_a_pack_is_missing(tmp_path, capsys):
    missing = str(tmp_path / "missing.kspack")
    for argv in (["pack", "verify", missing], ["pack", "inspect", missing],
                 ["pack", "import", missing, "--db", str(tmp_path / "k.db")], ["pack", "verify", missing, "--json"]):
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        assert out.err.strip() == f"error: pack not found: {missing}", out.err
        assert "signature" not in out.out + out.err
        if "--json" in argv:
            assert json.loads(out.out)["ok"] is False
    assert not (tmp_path / "k.db").exists()


@pytest.mark.parametrize("argv", [
    ["evolve", "p.py"], ["warm", "m:f"], ["explain", "m:f"], ["cache", "ls"], ["cache", "gc"],
    ["pack", "import", "p.kspack"], ["pack", "export", "-o", "p.kspack"], ["export-trajectories", "-o", "t.jsonl"],
])
def test_a_db_in_a_folder_that_does_not_exist_is_refused_before_anything_runs(argv, tmp_path, capsys):
    db = tmp_path / "nodir" / "k.db"
    assert main([*argv, "--db", str(db)]) == 2
    err = one_line_error(capsys)
    assert f"no kernel cache at {db}: the folder {db.parent} does not exist (check --db" in err, err
    assert not db.parent.exists()


def test_the_benchmark_runner_refuses_a_db_in_a_missing_folder(tmp_path, capsys):
    from benchmarks.run import main as bench

    db = tmp_path / "nodir" / "k.db"
    assert bench(["--suite", "llm-ops", "--device", "cpu", "--smoke", "--db", str(db)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not db.parent.exists()


def test_a_file_that_is_not_a_cache_is_a_usage_error(tmp_path, capsys):
    not_sqlite = tmp_path / "p.py"
    not_sqlite.write_text("x = 1\n")
    for argv in (["cache", "ls"], ["cache", "stats"], ["cache", "show", "1"]):
        assert main([*argv, "--db", str(not_sqlite)]) == 2, argv
        assert "is not a SQLite database" in one_line_error(capsys)
    assert not_sqlite.read_text() == "x = 1\n"


def test_a_typed_folder_for_kernelbench_is_checked(tmp_path, capsys):
    assert main(["warm", "--kernelbench", str(tmp_path / "nowhere"), "--db", str(tmp_path / "k.db")]) == 2
    assert "KernelBench folder not found" in one_line_error(capsys)
    assert main(["warm", "m:f", "--levels", "1", "--db", str(tmp_path / "k.db")]) == 2
    assert "--levels applies only with --kernelbench" in one_line_error(capsys)
    assert main(["warm", "m:f", "--hf-config", "llama", "--db", str(tmp_path / "k.db")]) == 2
    assert "give m:f or --hf-config llama, not both" in one_line_error(capsys)
    assert main(["warm", "m:f", "--from-misses", "--db", str(tmp_path / "k.db")]) == 2
    assert "give one of a source and --from-misses" in one_line_error(capsys)
    assert main(["warm", "m:f", "--seq", "4", "--db", str(tmp_path / "k.db")]) == 2
    assert "--seq applies only with --hf-config" in one_line_error(capsys)


def test_kernelbench_takes_a_checkout_its_levels_and_ids(tmp_path):
    from ks_inductor.warm.sources import WarmError, kernelbench_files

    src = (PROBLEMS / "rmsnorm.py").read_text()
    for level, names in ((1, ("1_A.py", "95_B.py")), (2, ("3_C.py",)), (4, ("9_HF.py",))):
        folder = tmp_path / "KernelBench" / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        for n in names:
            (folder / n).write_text(src)
    checkout = tmp_path / "KernelBench"
    assert [f.name for f in kernelbench_files(checkout)] == ["1_A.py", "95_B.py", "3_C.py"]  # levels 1-3
    assert [f.name for f in kernelbench_files(checkout / "KernelBench", [1], [95])] == ["95_B.py"]
    assert [f.name for f in kernelbench_files(checkout / "KernelBench" / "level2")] == ["3_C.py"]
    with pytest.raises(WarmError, match="no such level folder"):
        kernelbench_files(checkout, [3])
    with pytest.raises(WarmError, match="ids"):
        kernelbench_files(checkout, [1], [7])


# ------------------------------------------------------------------ exit codes


def _fake_warm(monkeypatch, statuses):
    import ks_inductor.warm as W

    items = [WarmItem(key=f"{i}" * 32, name=f"r{i}", origin="kernelbench", signature="float32[4]", status=s)
             for i, s in enumerate(statuses)]
    monkeypatch.setattr(W, "warm", lambda *a, **k: WarmSummary(items=items))


@pytest.mark.parametrize("statuses, code", [(["found", "skipped"], 0), (["found", "no-kernel"], 1),
                                            (["not-run"], 1), (["failed", "found"], 1), ([], 0)])
def test_warm_exits_1_when_a_region_got_no_kernel(tmp_path, monkeypatch, statuses, code, capsys):
    _fake_warm(monkeypatch, statuses)
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "rmsnorm.py").write_text((PROBLEMS / "rmsnorm.py").read_text())
    assert main(["warm", "--kernelbench", str(folder), "--db", str(tmp_path / "k.db"), "--json"]) == code
    assert len(json.loads(capsys.readouterr().out)["items"]) == len(statuses)


def test_the_exit_codes_are_documented_once_for_every_command():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "0 the job did what was asked" in readme and "1 it ran and found nothing" in readme and \
        "2 a usage error" in readme
    epilog = build_parser().epilog
    assert "0 done" in epilog and "1 the job ran and found nothing" in epilog and "2 a usage error" in epilog


def test_only_a_named_file_that_is_not_there_is_an_error(tmp_path, capsys):
    """A server database kernelsmith has not written to yet holds nothing; a SQLite path that is not there is a
    mistake in --db."""
    import argparse

    from kernel_cache.errors import NoDatabaseError
    from ks_inductor.cli.args import UsageError
    from ks_inductor.cli.output import missing_cache

    url = "postgresql://kernelsmith@db.example/kernels"
    missing_cache(argparse.Namespace(db=url), NoDatabaseError(url))
    assert capsys.readouterr().err.strip() == f"no kernel cache at {url}; nothing is stored yet"
    path = str(tmp_path / "kernels.db")
    with pytest.raises(UsageError, match="nothing has been stored there"):
        missing_cache(argparse.Namespace(db=path), NoDatabaseError(path))
    with pytest.raises(UsageError, match="its folder does not exist"):
        missing_cache(argparse.Namespace(db=str(tmp_path / "no" / "k.db")), NoDatabaseError(str(tmp_path / "no" / "k.db")))
