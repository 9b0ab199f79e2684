"""The untrusted side of a judgment: the jobs that run a candidate's code, in a sandboxed process of their own.

``run_record`` loads the candidate, compiles its kernels and records its forward as a launch plan (``plan.py``) on
inputs of its own drawing; the trusted side executes that plan for every trial and timed call (``plan_job``). The
process holds the candidate and nothing else of the judgment: no reference model or output, no baseline, no seed of
a trial or a timing set. The process ends with its job, so nothing a candidate leaves behind reaches another
candidate. ``run_vectors`` runs a pack's kernel on given golden vectors (``pack verify --run``).
"""

from __future__ import annotations

import os
import random
from typing import Any

from ks_inductor.judge import protocol as P


def load_candidate(source: str, workdir: str) -> Any:
    from ks_inductor.source_module import load_source_module

    # A real file: Triton's JIT reads kernel source through inspect.
    mod = load_source_module(source, "ks_candidate", workdir)
    if not hasattr(mod, "ModelNew"):
        raise LookupError("the candidate defines no ModelNew")
    return mod


def load_matching_state(model: Any, state: dict[str, Any]) -> None:
    """Give ModelNew the reference's weights when it holds the same parameters (names and shapes), whatever order
    it created them in; otherwise it keeps its own seeded initialisation."""
    own = model.state_dict()
    if state and set(state) == set(own) and all(state[k].shape == own[k].shape for k in state):
        model.load_state_dict(state)


def kernel_model(mod: Any, init_inputs: list[Any], state_file: str | None, seed: int, device: str) -> Any:
    """``mod``'s ModelNew built as the reference was (same seed, same init inputs), with the reference's weights
    (saved by the reference's job) where it holds the same parameters, on ``device`` in the reference's mode."""
    import torch
    from safetensors.torch import load_file

    from ks_inductor.judge.inputs import place_model

    torch.manual_seed(seed)
    model = mod.ModelNew(*init_inputs)
    if state_file:
        load_matching_state(model, load_file(state_file))
    return place_model(model, device)


def check_output_objects(outs: list[Any], device: str) -> list[tuple[str, str]]:
    import torch

    found = []
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor and not (isinstance(o, torch.Tensor) and type(o) is torch.nn.Parameter):
            found.append(("lazy_evaluation", f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"))
        elif o.device.type != ("cpu" if device == "cpu" else "cuda"):
            found.append(("wrong_device", f"output {i} is on {o.device}, expected {device}"))
        elif o.numel() and (o.untyped_storage().nbytes() == 0 or o.data_ptr() == 0):
            found.append(("lazy_evaluation", f"output {i} has no storage"))
    return found


def _first_of_each(flags: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    return [f for f in flags if not (f[0] in seen or seen.add(f[0]))]


class _Watch:
    """What the candidate changes in its own process that would reach a model it is served in: torch's and the
    timers' functions, numerics flags, threads, the current stream. A filter only: a candidate that hides such a
    change from this process changes nothing the trusted side runs."""

    def __init__(self, device: str) -> None:
        from ks_inductor.judge import guards

        self.device = device
        self.ids = guards.identity_snapshot()
        self.numerics = guards.numerics_flags()
        self.threads = guards.ThreadWatch("ks_candidate")
        self.threads.install()
        self.stream = guards.current_stream_id(device)

    def check(self, when: str) -> list[tuple[str, str]]:
        from ks_inductor.judge import guards

        found = []
        changed = [k for k, v in guards.identity_snapshot().items() if self.ids.get(k) != v]
        if changed:
            found.append(("monkeypatch", f"{when}: replaced {', '.join(changed)}"))
        nf = guards.numerics_flags()
        diff = [k for k in nf if nf[k] != self.numerics[k]]
        if diff:
            found.append(("global_config_change", f"{when}: changed torch settings {', '.join(diff)}"))
        if self.threads.candidate_threads():
            found.append(("thread_injection", f"{when}: the candidate started {len(self.threads.candidate_threads())} "
                          "thread(s)"))
        if guards.current_stream_id(self.device) != self.stream:
            found.append(("side_stream", f"{when}: switched the current stream"))
        return found


def _capture_check(model: Any, inputs: list[Any], counter: Any, launch: bool) -> list[tuple[str, str]]:
    """Whether the forward can be captured in a CUDA graph, as a served model's graph captures it (its kernels
    launched only where ``launch``: a capture of the rest shows a host sync all the same)."""
    import contextlib

    import torch

    from ks_inductor.judge.plan import without_launches

    counter.enabled = False  # a capture's launches go to its own stream
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph), (contextlib.nullcontext() if launch else without_launches()):
            model(*inputs)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - whatever stops the capture is the finding
        from ks_inductor.judge.timing import after_failed_capture

        after_failed_capture()
        return [("graph_capture", "the candidate cannot be captured in a CUDA graph, as serving runs kernels: "
                 + f"{type(e).__name__}: {e}".splitlines()[0][:300])]
    finally:
        counter.enabled = True
    return []


def run_record(job: dict[str, Any]) -> dict[str, Any]:
    """The candidate's process: load it, compile its kernels, and record its forward as a launch plan (``plan.py``)
    on inputs of its own drawing, twice. Nothing here is evidence but the plan, which the trusted side executes
    (``plan_job.run_plan``); the guards' findings only reject early what would be rejected anyway."""
    import torch
    from safetensors.torch import save_file

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge import guards
    from ks_inductor.judge import plan as PL
    from ks_inductor.judge.containment import contain
    from ks_inductor.judge.inputs import make_inputs
    from ks_inductor.judge.sandbox import confine_job

    device = job["device"]
    flags: list[tuple[str, str]] = []
    P.stage("load")
    problem = exec_problem_source(job["problem_source"], "<problem>")
    init_inputs = list(problem.get_init_inputs())
    sandbox = confine_job(job["workdir"], shared_memory=False).summary()
    sandbox += "; " + contain()  # after confine_job: with the capabilities dropped, the priority cannot come back
    counter = guards.LaunchCounter(device)
    counter.install()
    watch = _Watch(device)
    mod = load_candidate(job["candidate_source"], job["workdir"])
    model = kernel_model(mod, init_inputs, job.get("state_file"), job["init_seed"], device)
    flags.extend(watch.check("after import"))
    # Inputs of this process's own drawing: the trials' and the timing's seeds never reach it.
    draw = random.SystemRandom()

    def inputs() -> list[Any]:
        return make_inputs(problem, job["specs"], draw.getrandbits(62), "normal", device)

    P.stage("compile")
    # The kernels are recorded, not run: the trusted side compiles and runs them itself. Only a module with an
    # autotuner runs its forward once for real first, so that the configuration it records is the one it tunes to.
    tuned = PL.autotuned(mod)
    if tuned:
        with torch.no_grad():
            model(*inputs())
            P.sync(device)
    plans = []
    computed: set[str] = set()
    try:
        for _ in range(2):
            x = inputs()
            plan, payload, ops = PL.record(model, x, PL.state_tensors(model), PL.kernel_lookup(mod),
                                           launch=tuned)
            P.sync(device)
            plans.append(plan)
            computed |= ops
    except PL.PlanError as e:
        return {"flags": [*flags, ("plan", str(e).splitlines()[0][:400])], "sandbox": sandbox,
                "launches": dict(counter.counts)}
    flags.extend(watch.check("after recording"))
    if plans[1].launches() == 0:
        flags.append(("no_triton_launch", "forward returned without launching any Triton kernel"))
    if computed:
        flags.append(("torch_compute", "torch computed during forward (a launch plan carries Triton kernels, "
                      "allocations, fills and copies only): " + ", ".join(sorted(computed))))
    if not plans[0].same_launches(plans[1]):
        flags.append(("plan", "the forward launched differently on two draws of inputs: its launches depend on "
                      "the inputs' values, which a launch plan cannot follow"))
    with open(os.path.join(job["workdir"], PL.PLAN_FILE), "w", encoding="utf-8") as f:
        f.write(plans[1].to_json())
    if payload:
        save_file(payload, os.path.join(job["workdir"], PL.STATE_FILE))
    # What serving the forward would meet, which the plan does not show: launches on another stream than the
    # caller's, and a forward that a CUDA graph cannot capture (a host sync).
    if counter.off_stream:
        flags.append(("side_stream", f"{counter.off_stream} Triton launch(es) went to a stream other than the "
                      "current one"))
    if device != "cpu":
        flags.extend(_capture_check(model, inputs(), counter, launch=tuned))
    return {"flags": _first_of_each(flags), "sandbox": sandbox, "launches": dict(counter.counts),
            "ops_seen": sorted(computed)}


def _laid_out(dense: Any, stride: list[int] | None, device: str) -> Any:
    """A golden input, carried dense, on ``device`` at the strides it was given at."""
    import torch

    if not stride or len(stride) != dense.dim():
        return dense.to(device)
    return torch.empty_strided(dense.shape, stride, dtype=dense.dtype, device=device).copy_(dense)


def run_vectors(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from ks_inductor.judge import guards
    from ks_inductor.judge.containment import contain
    from ks_inductor.judge.sandbox import confine_job

    device = job["device"]
    P.stage("load")
    confine_job(job["workdir"])
    contain()
    counter = guards.LaunchCounter(device)
    counter.install()
    cand_mod = load_candidate(job["candidate_source"], job["workdir"])
    model = kernel_model(cand_mod, job.get("init_inputs", []), job.get("state_file"), job.get("init_seed", 0),
                         device)
    P.stage("correctness")
    P.acquire("shared")
    files, flags = [], []
    strides = job.get("input_strides") or [{}] * len(job["input_files"])
    for i, path in enumerate(job["input_files"]):
        data = load_file(path)
        inputs = [_laid_out(data[f"in{j}"], strides[i].get(str(j)), device) for j in range(len(data))]
        with torch.no_grad(), guards.TorchOpRecorder() as rec:
            outs = P.as_outputs(model(*inputs))
        P.sync(device)
        if rec.compute_ops():
            flags.append(("torch_compute", "torch computed during forward: " + ", ".join(rec.compute_ops())))
        flags.extend(check_output_objects(outs, device))
        out_path = os.path.join(job["workdir"], f"vec_out_{i}.safetensors")
        P.save(out_path, outs)
        files.append(out_path)
    P.release("shared")
    if counter.total() == 0:
        flags.append(("no_triton_launch", "forward returned without launching any Triton kernel"))
    return {"cand_files": files, "flags": flags, "launches": dict(counter.counts)}
