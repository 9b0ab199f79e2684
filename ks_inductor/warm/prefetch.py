"""Inductor's code generation for every region of a warm, started as soon as the regions are known.

A region's search seeds from Inductor's kernels, and their code generation (a throwaway process, forked from a warm
parent, that lowers the region: about a second per region, more for the first of a process) runs before the region's
first judgment. The regions of a warm are all known before the first search starts, so their generations run here in
the background, in the order the regions are listed, less those whose room settled them or whose search already
started by their turn: a search that starts later finds its plans made (they are memoized per process,
:func:`ks_inductor.seeds.inductor.generate.inductor_programs`) and a search that starts while its plans are being
made waits for that generation instead of starting a second one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig

log = logging.getLogger(__name__)

# Each generation is one process on one core (``TORCHINDUCTOR_COMPILE_THREADS=1``); a core in four is left to
# them, so that the judge's workers and compilers keep the rest.
CORES_PER_GENERATION = 4
MAX_GENERATIONS = 4


def prefetch_workers(cores: int | None = None) -> int:
    """Generations run at once: one per :data:`CORES_PER_GENERATION` cores, at least one, at most
    :data:`MAX_GENERATIONS`."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(MAX_GENERATIONS, cores // CORES_PER_GENERATION))


class CodegenPrefetch:
    """Generates Inductor's plans for ``problems`` on ``target`` in background threads, each generation ending by
    ``deadline`` (``time.monotonic()``; None: the generation's own timeout) and within ``limit_s`` of its start."""

    def __init__(self, problems: Sequence[Problem], target: str, deadline: float | None = None,
                 limit_s: float | None = None, workers: int | None = None,
                 skip: Callable[[str], bool] | None = None) -> None:
        self.target, self.deadline, self.limit_s, self.skip = target, deadline, limit_s, skip
        self._pool = ThreadPoolExecutor(workers or prefetch_workers(), thread_name_prefix="ks-warm-codegen")
        self._futures = [self._pool.submit(self._one, p) for p in problems]

    def _one(self, problem: Problem) -> None:
        from ks_inductor.seeds.inductor.generate import codegen_deadline, inductor_programs

        # A search that finds its region's generation in progress waits for it: ending it within a search's own
        # limit of its start keeps that wait within the search's limit, whenever the search started.
        ends = [t for t in (self.deadline, None if self.limit_s is None else time.monotonic() + self.limit_s)
                if t is not None]
        at = min(ends) if ends else None
        if at is not None and at <= time.monotonic():
            return
        if self.skip is not None and self.skip(problem.key):
            return  # settled by its room, or its search already generates it
        try:
            with codegen_deadline(at):
                inductor_programs(problem, self.target)
        except Exception as e:  # noqa: BLE001 - the search generates again and reports what fails
            log.debug("prefetching Inductor's plans for %s: %s", problem.name, e)

    def close(self) -> None:
        """Drop the generations not started; one in progress ends by itself (by the deadline at the latest), and
        waiting for it would only hold the run's end."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def start_prefetch(problems: Sequence[Problem], config: EvolveConfig, target: str | None, deadline: float | None,
                   skip: Callable[[str], bool] | None = None) -> CodegenPrefetch | None:
    """A started :class:`CodegenPrefetch` for the searches of ``problems`` about to run here (``config``'s
    per-search limit bounding each generation; a region whose key ``skip`` names when its turn comes is left out),
    or None where there is nothing to generate ahead, the searches seed from no Inductor code
    (``config.inductor_seeds`` off) or the judge's device is not known."""
    if not problems or not config.inductor_seeds or target is None:
        return None
    return CodegenPrefetch(problems, target, deadline, config.time_limit_s, skip=skip)
