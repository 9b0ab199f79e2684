"""The judge's worker process: runs one job and exits.

Started as ``python -m ks_inductor.judge.worker FD``, or forked from the judge's warm fork server
(``forkserver.py``). It imports torch and triton, says ``ready`` on FD, then reads one JSON job from stdin and runs
it: the reference's outputs and the baselines' timing (``reference_job``, trusted: never candidate code), a
candidate's launch plan recorded (``candidate_job.run_record``, untrusted) or executed, checked and timed
(``plan_job``, trusted: the candidate's kernels, never its Python), or a candidate on given vectors. Progress (stage changes, requests for the
device's timing lock, each output handed over for the judge to compare) and the result go out on FD as JSON lines
(``protocol``); tensors go to safetensors files in the job's folder. Anything the code prints lands in the worker's
log, never in the protocol. One job a process: nothing one candidate leaves behind (a hook, a patched module, a
cache, a thread) exists when the next one runs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import traceback
from typing import Any

from ks_inductor.judge import protocol as P


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        return 1024 * next((int(ln.split()[1]) for ln in f if ln.startswith("VmSize:")), 0)


def _set_memory_limit(limit_mb: int) -> None:
    import resource

    limit = _vm_bytes() + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _failure(e: BaseException) -> dict[str, Any]:
    """The result message of a job that raised ``e``."""
    msg = f"{type(e).__name__}: {e}"
    device_error = any(s in msg for s in ("CUDA error", "illegal memory access", "cudaError", "device-side",
                                          "AcceleratorError", "unspecified launch failure"))
    oom = isinstance(e, MemoryError) or any(
        s in msg.lower() for s in ("out of memory", "can't allocate memory", "cannot allocate memory"))
    # The trial outputs go to the judge's scratch folder; a full disk there is the judge's limit, not the code's.
    no_space = (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "no space left on device" in msg.lower()
    return {"event": "result", "ok": False, "error": msg, "traceback": traceback.format_exc(limit=8),
            "device_error": device_error, "oom": oom, "no_space": no_space}


def _handler(kind: str) -> Any:
    from ks_inductor.judge import candidate_job, plan_job, reference_job

    return {"reference": reference_job.run_reference, "baselines": reference_job.run_baselines,
            "record": candidate_job.run_record, "plan": plan_job.run_plan,
            "vectors": candidate_job.run_vectors}[kind]


def preload(warm: bool = False) -> None:
    """Imports done before "ready", so that spares (or the fork server) hide them. ``warm`` adds what the first
    candidate call would import anyway: torch._dynamo, which the op recorder's dispatch mode pulls in (1.2-1.6 s)."""
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    import ks_inductor.judge.candidate_job  # noqa: F401
    import ks_inductor.judge.guards  # noqa: F401
    import ks_inductor.judge.inputs  # noqa: F401
    import ks_inductor.judge.kernel_source  # noqa: F401
    import ks_inductor.judge.plan  # noqa: F401
    import ks_inductor.judge.plan_job  # noqa: F401
    import ks_inductor.judge.reference_job  # noqa: F401
    import ks_inductor.judge.sandbox  # noqa: F401
    import ks_inductor.problem_tracing  # noqa: F401

    if warm:
        import torch._dynamo  # noqa: F401


def preload_for_fork() -> None:
    """The fork server's imports (``forkserver.py``): everything a candidate's first call would import."""
    preload(warm=True)


def main() -> None:
    preload(warm=True)
    serve(int(sys.argv[1]))


def serve(events_fd: int) -> None:
    """Say ready on ``events_fd``, run the one job that comes on stdin, report its result and exit."""
    import torch

    P.open_channel(events_fd)
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        # A GPU worker makes its device context before it says ready: a spare does it while it waits, off the
        # judgment's path, where contexts made by many workers at once queue in the driver.
        torch.cuda.init()
        torch.empty(1, device="cuda")
    P.send({"event": "ready", "pid": os.getpid()})
    line = sys.stdin.readline()
    if not line:
        return
    job = json.loads(line)
    os.chdir(job["workdir"])
    try:
        if job["device"] == "cpu":
            _set_memory_limit(job["memory_limit_mb"])
        else:
            torch.cuda.set_per_process_memory_fraction(job["device_memory_fraction"])
        result = _handler(job["kind"])(job)
        P.send({"event": "result", "ok": True, **result})
    except BaseException as e:  # noqa: BLE001 - everything becomes a structured verdict
        with contextlib.suppress(Exception):
            P.send(_failure(e))
        # Whatever happened, this process is retired: a CUDA error poisons the context for good.
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":
    main()
