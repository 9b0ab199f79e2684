"""The report: markdown table, closing note and plots from a result JSON, on CPU."""

from __future__ import annotations

import json

import pytest

from benchmarks.report import closing_note, fmt_ms, main, render_markdown
from benchmarks.results import (
    KERNELSMITH,
    default_result_path,
    load_result,
)
from tests.bench_results import synthetic


def test_round_trip_and_derived_figures(tmp_path):
    r = synthetic()
    p = r.save(tmp_path / "r.json")
    back = load_result(p)
    assert back.to_json() == r.to_json()
    rms, ce = back.workloads
    assert rms.best_peer()[0] == "F.rms_norm"
    assert rms.ratio_to_best_peer() == pytest.approx(0.026 / 0.020)
    assert rms.fraction_of_floor(KERNELSMITH) == pytest.approx(0.0159 / 0.020)
    assert ce.best_peer()[0] == "inductor" and ce.ratio_to_best_peer() is None


def test_markdown_has_table_failures_and_closing_note():
    r = synthetic()
    md = render_markdown(r, {"speedup": "x-speedup.png"})
    assert "| workload | shape | eager | inductor | inductor-max-autotune | liger | F.rms_norm | kernelsmith |" in md
    assert "4,227 GB/s" in md and "694 TFLOP/s" in md and "NVIDIA H200" in md and "driver 570.1" in md
    row = next(line for line in md.splitlines() if line.startswith("| rmsnorm-bf16-prefill"))
    assert "20.0 µs ±" in row and "1.30x (F.rms_norm)" in row and "80%" in row and "61% (F.rms_norm)" in row
    ce_row = next(line for line in md.splitlines() if line.startswith("| cross_entropy"))
    assert "failed [1]" in ce_row and "no verified kernel" in ce_row and "n/a" in ce_row
    assert "1. cross_entropy-fp32-prefill, liger: TypeError" in md
    assert "![speedup](x-speedup.png)" in md
    note = closing_note(r)
    assert "1.30x the best peer (lower bound 1.25x), 80% of the floor" in note[0]
    assert note[1].startswith("- **cross_entropy-fp32-prefill**: no verified kernel; best peer inductor")


def test_report_cli_writes_md_and_pngs_where_asked(tmp_path):
    path = synthetic().save(tmp_path / "llm-ops-h200.json")
    out = tmp_path / "out" / "report.md"
    out.parent.mkdir()
    assert main([str(path), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["report-roofline.png", "report-speedup.png", "report.md"]
    for f in out.parent.iterdir():
        assert f.stat().st_size > 0
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-ops-h200.json", "out"]


def test_report_without_output_prints_and_writes_nothing(tmp_path, capsys):
    """A committed result's report stays as committed: `report FILE --no-plots` prints, it does not rewrite."""
    path = synthetic().save(tmp_path / "llm-ops-h200.json")
    (tmp_path / "llm-ops-h200.md").write_text("the committed report\n")
    for argv in ([str(path), "--no-plots"], [str(path)]):
        assert main(argv) == 0
        assert capsys.readouterr().out.startswith("# ")
    assert (tmp_path / "llm-ops-h200.md").read_text() == "the committed report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm-ops-h200.json", "llm-ops-h200.md"]


def test_report_on_bad_input(tmp_path, capsys):
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert main([str(bad)]) == 2
    assert "not a kernelsmith benchmark result" in capsys.readouterr().err


def test_kernelbench_summary_table():
    r = synthetic()
    r.suite = "kernelbench"
    r.summary = {"all": {"vs_eager": {"n": 2, "correct": 1, "fast_p": {"1": 0.5, "1.05": 0.5, "1.5": 0.5, "2": 0.0},
                                      "geomean_speedup": 1.7},
                         "vs_inductor": {"n": 2, "correct": 1, "fast_p": {"1": 0.0, "1.05": 0.0, "1.5": 0.0,
                                                                          "2": 0.0}, "geomean_speedup": 0.9},
                         "inductor_vs_eager_geomean": 1.4}, "levels": {}}
    md = render_markdown(r)
    assert "| all | eager | 2 | 1 | 50% | 50% | 50% | 0% | 1.70x |" in md
    assert "Inductor over eager, geometric mean over the problems both ran: 1.40x." in md


def test_small_helpers():
    assert fmt_ms(0.0000234) == "0.02 µs"
    assert fmt_ms(0.0477) == "47.7 µs"
    assert fmt_ms(0.243) == "243 µs"
    assert fmt_ms(3.74) == "3.74 ms"
    assert fmt_ms(None) == "–"
    assert default_result_path("llm-ops", "NVIDIA H200").name.startswith("llm-ops-nvidia-h200-")
