"""merge_kernels: Inductor's plan of several kernels over the same rows (a log-softmax, then the target's gather,
then the mean) becomes one kernel that keeps the intermediates (the running max and sum, the target's logit) in
registers and writes only the result."""

from __future__ import annotations

from ks_inductor.evolve.operators.base import ANY, Operator
from ks_inductor.evolve.operators.feedback import Feedback
from ks_inductor.evolve.operators.registry import register


def plan_kernels(params: dict) -> int:
    """Kernels in an Inductor plan, from its parameters' ``K<i>_`` prefixes; 1 for any other program."""
    idx = {k.split("_", 1)[0] for k in params if k.startswith("K") and k.split("_", 1)[0][1:].isdigit()}
    return max(1, len(idx))


class MergeKernels(Operator):
    name = "merge_kernels"
    what = ("fuse the consecutive kernels of Inductor's plan over the same rows into one kernel that keeps the "
            "intermediates (running max and sum, the target's logit) in registers and reads each row once")
    moves = (("inductor", ANY, "cross_entropy", ANY),)

    def score(self, fb: Feedback) -> float:
        # Each kernel boundary writes the intermediates out and reads the rows again.
        n = plan_kernels(fb.params)
        if n >= 2:
            return 1.0 if fb.memory_bound else 0.6
        return 0.2


register(MergeKernels())
