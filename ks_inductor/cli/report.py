"""``kernelsmith report RESULT.json``: the markdown table (and plots) of a benchmark result, by the repository's
``python -m benchmarks.report``, with every argument passed on. It prints the table, and writes files only where
``-o`` says."""

from __future__ import annotations

from typing import Any

from ks_inductor.cli.bench import register_program


def register(sub: Any) -> None:
    register_program(sub, "report", "report",
                     "print the markdown table of a benchmark result, or write it and its plots with -o "
                     "(python -m benchmarks.report)")
