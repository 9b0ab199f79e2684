"""The ``kernelsmith`` command, on top of the library: nothing in ks_inductor, kernel_cache or the integrations
imports from here. One module per command (``eval``, ``evolve``, ``warm``, ``explain``, ``cache``, ``pack``,
``trajectories`` for export-trajectories, ``bench``, ``report``), each a thin layer over the library's functions;
the flags they share are declared once in :mod:`ks_inductor.cli.args`, and where their output goes in
:mod:`ks_inductor.cli.output`.

    kernelsmith COMMAND ...        (the console script: ks_inductor.cli:main)
    python -m ks_inductor.cli COMMAND ...
"""

from __future__ import annotations

from ks_inductor.cli.args import UsageError
from ks_inductor.cli.eval import stage_table
from ks_inductor.cli.main import build_parser, main

__all__ = ["UsageError", "build_parser", "main", "stage_table"]
