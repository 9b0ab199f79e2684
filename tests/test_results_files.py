"""benchmarks/results/ holds one current file per benchmark and device, and every result file the README, the docs
and the code cite is there."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MAX_FILES = 33
# <benchmark>-<device>-<date>[-suffix].<ext>, with {a,b} alternatives where a citation names several.
_CITED = re.compile(r"[a-z0-9][a-z0-9{},-]*-\d{4}-\d{2}-\d{2}(?:-[a-z]+)?(?:\.\{[a-z,]+\}|\.[a-z]+)")
_DATED = re.compile(r"^(?P<name>.+)-(?P<date>\d{4}-\d{2}-\d{2})(?:-[a-z]+)?\.[a-z]+$")


def _expand(cited: str) -> list[str]:
    """``serve-{a,b}-2026-01-01.json`` -> both names."""
    parts = re.split(r"\{([^}]*)\}", cited)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for pkg in ("ks_inductor", "kernel_cache", "integrations", "benchmarks"):
        files += sorted(p for p in (ROOT / pkg).rglob("*.py"))
    return files


def cited_results(files: list[Path]) -> dict[str, list[str]]:
    """Result file name -> where it is cited (path:line)."""
    out: dict[str, list[str]] = {}
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in _CITED.finditer(line):
                for name in _expand(m.group(0)):
                    out.setdefault(name, []).append(f"{f.name}:{n}")
    return out


def older_runs(names: list[str]) -> dict[str, list[str]]:
    """<benchmark>-<device> -> its dates, where more than one file of it is kept."""
    by_run: dict[str, set[str]] = {}
    for name in names:
        m = _DATED.match(name)
        assert m, f"{name}: name it <benchmark>-<device>-<date>.json"
        by_run.setdefault(m["name"], set()).add(m["date"])
    return {run: sorted(dates) for run, dates in by_run.items() if len(dates) > 1}


def test_every_cited_result_file_exists() -> None:
    cited = cited_results(_citing_files())
    assert cited, "no result file is cited at all: the citation pattern no longer matches"
    missing = {name: where for name, where in cited.items() if not (RESULTS / name).exists()}
    assert not missing, f"cited but not in benchmarks/results/: {missing}"


def test_one_current_file_per_benchmark_and_device() -> None:
    files = sorted(p.name for p in RESULTS.iterdir())
    assert len(files) <= MAX_FILES, f"{len(files)} result files; keep the current one per benchmark and device"
    older = older_runs(files)
    assert not older, f"superseded result files kept beside the current one: {older}"


def test_citations_and_older_runs_are_read_as_meant(tmp_path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("Raw: `serve-x-{h100,h200}-2026-01-02.json` and `judge-h200-2026-01-01.{json,md}`.\n")
    assert set(cited_results([doc])) == {"serve-x-h100-2026-01-02.json", "serve-x-h200-2026-01-02.json",
                                         "judge-h200-2026-01-01.json", "judge-h200-2026-01-01.md"}
    assert older_runs(["judge-h200-2026-01-01.json", "judge-h200-2026-01-05.json", "judge-h100-2026-01-01.json"]) \
        == {"judge-h200": ["2026-01-01", "2026-01-05"]}
