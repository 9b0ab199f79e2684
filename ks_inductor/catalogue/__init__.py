"""The problems kernelsmith is tested and benchmarked on, in one package the tests and the benchmarks both import.

``problems/``: the serving ops as KernelBench files at their real sizes (``problems/cpu/``: small ones a CPU runs
in the quick start). :mod:`.sources`: a problem's source written from its forward (``module``, ``norm_module``), and
the serving problems at test sizes (``small_problem``). :mod:`.families`: problems by the op family each must
classify as, or that every family declines. :mod:`.attention`: decode and prefill attention problems.
:mod:`.models`: small models for the compile backend and ``warm``.
"""

from pathlib import Path

PROBLEM_DIR = Path(__file__).resolve().parent / "problems"
