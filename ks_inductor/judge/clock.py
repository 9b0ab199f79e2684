"""Where a judgment's wall time goes: a clock that charges the time between switches to the stage it was in.

One judgment runs on one judge thread, so a clock is never shared between threads. Every second between the
clock's start and ``stop`` is charged to exactly one stage, so the stages sum to the judgment's wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# The stages a judgment's time is split into, in the order a candidate meets them (``EvalResult.stage_s``).
STAGE_NAMES = {
    "static": "static checks of the source",
    "reference": "the reference's outputs (computed once per problem, then cached)",
    "device_wait": "waiting for a device slot or the device's timing lock",
    "worker_start": "starting (or forking) a worker and its imports",
    "load": "importing the problem and the candidate, building the models",
    "compile": "the candidate's first call (Triton compiles)",
    "correctness": "correctness trials: inputs, the reference's and the candidate's calls",
    "checks": "the worker's checks after each trial (tampering, inputs changed in place, output objects)",
    "stash": "trial outputs copied to host memory while the device is held",
    "compare": "the judge comparing outputs the worker hands over",
    "timing_setup": "timing inputs set up",
    "inductor": "compiling the Inductor baseline (torch.compile and its first call)",
    "timing": "interleaved timing of candidate and baselines, re-checks of rotated inputs",
    "timing_checks": "re-checks of rotated inputs, work hidden on other streams, the copy bandwidth",
    "steady_state": "timing inside a CUDA graph",
    "teardown": "stopping the worker",
    "verdict": "summing up the verdict (speedups, plausibility)",
    "other": "stages a worker named that the judge does not know",
}


class StageClock:
    def __init__(self) -> None:
        self._t = time.monotonic()
        self.current: str | None = None
        self.seconds: dict[str, float] = {}
        # How long the worker held the device, per lock mode: it overlaps the stages (correctness holds it shared,
        # timing alone), and it is what a device's other judgments wait for.
        self.held: dict[str, float] = {}
        self._granted: dict[str, list[float]] = {}

    def granted(self, mode: str) -> None:
        self._granted.setdefault(mode, []).append(time.monotonic())

    def released(self, mode: str) -> None:
        if self._granted.get(mode):
            t = self._granted[mode].pop()
            self.held[mode] = self.held.get(mode, 0.0) + time.monotonic() - t

    def enter(self, name: str | None) -> str | None:
        """Charge the time since the last switch to the current stage and make ``name`` current; returns the
        stage it left."""
        now = time.monotonic()
        if self.current is not None:
            self.seconds[self.current] = self.seconds.get(self.current, 0.0) + (now - self._t)
        self._t = now
        left, self.current = self.current, name
        return left

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Charge what runs inside to ``name``, then go back to the stage it interrupted."""
        left = self.enter(name)
        try:
            yield
        finally:
            self.enter(left)

    def stop(self) -> dict[str, float]:
        self.enter(None)
        for mode in [m for m, ts in self._granted.items() if ts]:
            while self._granted[mode]:
                self.released(mode)
        return {k: round(v, 6) for k, v in self.seconds.items()}

    def device_held(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.held.items()}
