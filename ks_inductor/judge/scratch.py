"""How many reference outputs the judge can keep on its scratch disk.

The judge keeps the reference's outputs of every correctness trial and every timing set for the life of a problem,
and each candidate's outputs pass through the same folder one file at a time (the judge compares each as it comes
and deletes it). At serving shapes that is a few hundred MB; KernelBench's level-1 problems have 8.6 GB outputs,
and eight of those fill a 64 GiB disk. This is the one place that decides, from the size of one trial's outputs,
how many of each the judge runs so that they fit; fewer of each is a weaker check, and the judgment says so.
"""

from __future__ import annotations

from dataclasses import dataclass

USABLE = 0.8  # of the free space: headroom for logs, compiler caches and a candidate's file in flight
MIN_SETS = 2  # rotating inputs need two contents, or a result cached by input address goes unnoticed
MIN_TRIALS = 1


@dataclass(frozen=True)
class TrialFit:
    trials: int
    sets: int
    fits: bool  # False: even the minimum does not fit (the judge tries it and reports a full disk if it fills)



def shortfall_note(trials: int, planned_trials: int, sets: int, planned_sets: int, out_bytes: int,
                   free_bytes: int) -> str:
    """What a verdict says when the judge ran fewer trials or timing sets than configured; empty when it did not."""
    if (trials, sets) == (planned_trials, planned_sets):
        return ""
    return (f"fewer checks for lack of scratch disk: each trial's outputs take {out_bytes / 2**30:.2f} GiB and the "
            f"judge's folder had {free_bytes / 2**30:.1f} GiB free, so it ran {trials} of {planned_trials} correctness "
            f"trials and {sets} of {planned_sets} timing input sets (set TMPDIR to a larger disk for all of them)")


def fit_trials(out_bytes: int, trials: int, sets: int, free_bytes: int, in_flight: int) -> TrialFit:
    """The most trials and timing sets (up to ``trials`` and ``sets``) whose reference outputs, plus one candidate
    output for each of ``in_flight`` judgments, fit in ``USABLE`` of ``free_bytes``. Timing sets go first (down to
    ``MIN_SETS``), then trials (down to ``MIN_TRIALS``): the trials' input distributions find more bugs than a third
    rotating set does."""
    budget = USABLE * free_bytes
    per = max(out_bytes, 1)

    def fits(t: int, s: int) -> bool:
        return (t + s + max(in_flight, 1)) * per <= budget

    t, s = trials, sets
    while not fits(t, s) and s > min(MIN_SETS, sets):
        s -= 1
    while not fits(t, s) and t > MIN_TRIALS:
        t -= 1
    return TrialFit(t, s, fits(t, s))
