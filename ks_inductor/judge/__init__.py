"""The judge: the only thing that decides "correct" and "faster".

    from ks_inductor.judge import Judge, JudgeConfig
    with Judge(JudgeConfig(backend="triton-interpret")) as judge:
        result = judge.evaluate(problem, candidate_source)     # EvalResult
        futures = [judge.submit(problem, s) for s in sources]  # concurrent.futures.Future[EvalResult]

Candidates run in spawned worker processes; reference outputs come from a separate process the candidate never
shares; outputs are compared here, in the caller's process.
"""

from ks_inductor.judge.config import JudgeConfig
from ks_inductor.judge.verdict import ACCEPTED, ERROR, QUARANTINED, REJECTED, EvalResult, Mismatch, Timing

__all__ = [
    "ACCEPTED", "ERROR", "QUARANTINED", "REJECTED", "EvalResult", "Judge", "JudgeConfig", "Mismatch", "Timing",
    "evaluate", "static_check",
]


def __getattr__(name: str):  # lazy: importing the package must stay cheap for the CLI and the backend
    if name in ("Judge", "evaluate"):
        from ks_inductor.judge import service

        return getattr(service, name)
    if name == "static_check":
        from ks_inductor.judge.static_checks import static_check

        return static_check
    raise AttributeError(name)
