"""The untrusted side of a judgment: the job that runs a candidate's code, in a process of its own.

The process holds the candidate, the inputs it is given and the runtime guards, and nothing else of the judgment:
no reference model, no reference output, no baseline, no comparison. Each output it produces goes to the judge's
own process, which compares it with the reference's (``service._Streamed``); the baselines are timed by a trusted
process of their own (``reference_job.run_baselines``) with the same loops. The process ends with its job, so
nothing a candidate leaves behind reaches another candidate.
"""

from __future__ import annotations

import os
import random
from typing import Any

from ks_inductor.judge import protocol as P

# Sets whose CUDA-graph outputs go to the judge after each timed replay of the candidate, besides every set of the
# last replay: a result kept across replays is wrong in every set, since every replay brings new contents.
GRAPH_CHECKS_PER_REPLAY = 2


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


class _Seen:
    """What the correctness trials saw, for the flags that sum them up (also when the judge stops the job early)."""

    def __init__(self) -> None:
        self.flags: list[tuple[str, str]] = []
        self.torch_ops: set[str] = set()  # every aten op the forward calls dispatched, allowed or not
        self.launches_per_call: list[int] = []
        self.counter: Any = None  # the Triton launch counter (guards.LaunchCounter), once installed

    def trial_flags(self) -> list[tuple[str, str]]:
        from ks_inductor.judge.guards import compute_ops

        out = []
        computed = compute_ops(self.torch_ops)
        if computed:
            out.append(("torch_compute", "torch computed during forward: " + ", ".join(computed)))
        off_stream = self.counter.off_stream if self.counter is not None else 0
        if off_stream:
            out.append(("side_stream", f"{off_stream} Triton launch(es) went to a stream other than the current one"))
        if self.launches_per_call and min(self.launches_per_call) == 0:
            out.append(("no_triton_launch", "forward returned without launching any Triton kernel"))
        return out


def run_candidate(job: dict[str, Any]) -> dict[str, Any]:
    seen = _Seen()
    try:
        return _run_candidate(job, seen)
    except P.Stop:
        # The judge rejected an output; what the guards saw until then still goes into the verdict.
        return {"stopped": True, "flags": _first_of_each(seen.flags + seen.trial_flags()),
                "ops_seen": sorted(seen.torch_ops)}


def _run_candidate(job: dict[str, Any], seen: _Seen) -> dict[str, Any]:
    import torch

    from ks_inductor.judge import guards
    from ks_inductor.judge.inputs import make_inputs
    from ks_inductor.judge.sandbox import confine_job
    from ks_inductor.problem import exec_problem_source

    device = job["device"]
    flags, torch_ops, launches_per_call = seen.flags, seen.torch_ops, seen.launches_per_call
    P.stage("load")
    # The problem's module makes the inputs (its get_inputs is the user's code, trusted); its Model is never built
    # here. Loaded before the sandbox closes, as the candidate is after it.
    problem = exec_problem_source(job["problem_source"], "<problem>")
    init_inputs = list(problem.get_init_inputs())
    sandbox = confine_job(job["workdir"]).summary()
    counter = seen.counter = guards.LaunchCounter(device)
    counter.install()
    ids_before = guards.identity_snapshot()
    numerics_before = guards.numerics_flags()
    threads = guards.ThreadWatch("ks_candidate")
    threads.install()
    stream_before = guards.current_stream_id(device)

    def guard_check(when: str) -> None:
        changed = [k for k, v in guards.identity_snapshot().items() if ids_before.get(k) != v]
        if changed:
            flags.append(("monkeypatch", f"{when}: replaced {', '.join(changed)}"))
        nf = guards.numerics_flags()
        diff = [k for k in nf if nf[k] != numerics_before[k]]
        if diff:
            flags.append(("global_config_change", f"{when}: changed torch settings {', '.join(diff)}"))
        if threads.candidate_threads():
            flags.append(("thread_injection", f"{when}: the candidate started {len(threads.candidate_threads())} "
                          "thread(s)"))
        if guards.current_stream_id(device) != stream_before:
            flags.append(("side_stream", f"{when}: switched the current stream"))

    model = kernel_model(load_candidate(job["candidate_source"], job["workdir"]), init_inputs, job.get("state_file"),
                         job["init_seed"], device)
    guard_check("after import")

    trials = job["trials"]
    out_specs = job["output_specs"]
    P.stage("compile")
    with torch.no_grad():
        warm_inputs = make_inputs(problem, job["specs"], trials[0][0], trials[0][1], device)
        first = model(*warm_inputs)
        P.sync(device)
        # Everything a trial does for the first time (the op recorder's dispatch machinery, the poison's
        # allocations) happens here, before the device is held for the trials.
        with guards.TorchOpRecorder():
            pass
        P.poison(out_specs, device)
        if warm_inputs:
            P.bitwise_equal(warm_inputs[0], warm_inputs[0])
    del first, warm_inputs
    guard_check("after the first call")
    P.stage("correctness")
    # The device is held (shared) while the trials compute; their outputs wait in host memory and are handed over
    # after it is released, because writing them and the judge's comparisons are host work that a timing waiting
    # for the device alone should not wait for.
    later = P.Deliveries(P.STASH_BYTES)
    P.acquire("shared")
    for i, (seed, dist) in enumerate(trials):
        inputs = make_inputs(problem, job["specs"], seed, dist, device)
        saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            P.poison(out_specs, device, wait=False)
            before = counter.total()
            with guards.TorchOpRecorder() as rec:
                outs = P.as_outputs(model(*inputs))
            P.sync(device)
            launches_per_call.append(counter.total() - before)
            torch_ops.update(rec.ops)
        P.mark("checks")
        guard_check(f"trial {i}")
        for j, (a, b) in enumerate(zip(inputs, saved)):
            if not P.bitwise_equal(a, b):
                flags.append(("inputs_modified", f"trial {i}: the candidate changed input {j} in place"))
        flags.extend(check_output_objects(outs, device))
        del inputs, saved
        P.mark("stash")
        later.hand(job["workdir"], "trial", i, [o for o in outs if isinstance(o, torch.Tensor)])
        del outs
        P.mark("correctness")
    P.release("shared")
    later.flush()
    flags.extend(seen.trial_flags())

    result: dict[str, Any] = {"launches": dict(counter.counts), "launches_per_call": launches_per_call,
                              "sandbox": sandbox}
    if job.get("timing"):
        result.update(_timing(job, problem, model, counter, flags, device))
        guard_check("after timing")
    result["flags"] = _first_of_each(flags)
    result["ops_seen"] = sorted(torch_ops)
    return result


def _timing(job: dict[str, Any], problem: Any, model: Any, counter: Any, flags: list[tuple[str, str]],
            device: str) -> dict[str, Any]:
    import torch

    from ks_inductor.judge import timing as T
    from ks_inductor.judge.inputs import make_inputs

    cfg = job["timing"]
    P.mark("timing_setup")
    sets = [make_inputs(problem, job["specs"], seed, dist, device) for seed, dist in job["timing_sets"]]
    active = [x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]]
    before_each = T.refresher(active, sets, job["output_specs"], device)
    fns = {"candidate": lambda: model(*active)}
    # The device alone for a measurement; an untimed run (the interpreter's re-check of rotated inputs) measures
    # nothing, and holding the device alone would only leave a core idle while another judgment waits.
    mode = "exclusive" if job["timed"] else "shared"
    later = P.Deliveries(P.STASH_BYTES)
    P.acquire(mode)
    P.stage("timing")
    try:
        with torch.no_grad():
            if job["timed"]:
                samples = T.benchmark_interleaved(
                    fns, rounds=cfg["rounds"], warmup_ms=cfg["warmup_ms"], rep_ms=cfg["rep_ms"],
                    min_reps=cfg["min_reps"], max_reps=cfg["max_reps"], before_each=before_each,
                    seed=job["order_seed"], device=device,
                    flush=T.make_l2_flush(device, job.get("l2_bytes", 0)))
            else:
                # The interpreter's clock means nothing; run the same rotating loop briefly so that caching and
                # stateful candidates are still exercised and re-checked.
                samples = T.benchmark_interleaved(
                    fns, rounds=2, warmup_ms=0.0, rep_ms=0.0, min_reps=2, max_reps=2, before_each=before_each,
                    seed=job["order_seed"], device="cpu")
            wall = None
            P.mark("timing_checks")
            if job["timed"]:
                # Work hidden on another stream escapes events but not a device-wide sync after each call.
                scratch = torch.empty(1, device=device)
                wall = {"hidden_ms": T.post_enqueue_ms(fns["candidate"], 30, device),
                        "overhead_ms": T.post_enqueue_ms(scratch.zero_, 30, device)}
            # Every timing set once more, as each timed call saw it (same addresses, poisoned outputs): the judge
            # compares each with the reference's outputs for that set.
            for k in range(len(sets)):
                before_each(k)
                outs = P.as_outputs(model(*active))
                P.sync(device)
                later.hand(job["workdir"], "post", k, outs)
                del outs
            steady: dict[str, Any] = {}
            if job["timed"] and cfg.get("steady") and device != "cpu":
                # The graph's warm-up and capture run on streams of their own, and whatever a candidate records
                # there is timed and checked with the replay; the per-call checks of streams are done by now.
                counter.enabled = False
                P.mark("steady_state")
                try:
                    steady = _steady_state(job, model, sets, flags, device, later)
                finally:
                    counter.enabled = True
                P.mark("timing")
    finally:
        P.release(mode)
    later.flush()
    if counter.off_stream and not any(f[0] == "side_stream" for f in flags):
        flags.append(("side_stream", f"{counter.off_stream} Triton launch(es) during timing went to a stream other "
                      "than the current one"))
    return {"samples": samples, "wall": wall, **steady}


def _steady_state(job: dict[str, Any], model: Any, sets: list[list[Any]], flags: list[tuple[str, str]],
                  device: str, later: P.Deliveries) -> dict[str, Any]:
    """The candidate timed inside a CUDA graph (``timing.steady_state_samples``). A graph replays whatever
    was captured, so a candidate that computes only while it is being watched, or that learns its inputs once, would
    look fast here: after every timed replay a few sets' outputs go to the judge, compared with the reference's
    outputs for the contents that replay saw, and every set of the last replay."""
    from ks_inductor.judge.timing import steady_state_samples

    picker = random.Random(job["order_seed"] + 1)
    handed = {"n": 0}
    last: dict[str, Any] = {}

    def after_replay(name: str, held: dict[int, list[Any]], shift: int) -> None:
        count = len(held)
        last["held"], last["shift"] = held, shift
        for k in sorted(picker.sample(range(count), min(count, GRAPH_CHECKS_PER_REPLAY))):
            later.hand(job["workdir"], "graph", handed["n"], held[k], set=(k + shift) % len(sets))
            handed["n"] += 1

    got = steady_state_samples(job, {"candidate": model}, sets, device, after_replay)
    errors = got.get("steady_errors") or {}
    if "out of memory" in errors.get("candidate", "").lower():
        return {"steady_skipped": f"the CUDA-graph timing ran out of device memory: {errors['candidate'][:200]}"}
    if "candidate" in errors:
        flags.append(("graph_capture", "the candidate cannot be captured in a CUDA graph, as serving runs kernels: "
                      + errors["candidate"]))
        return {}
    if "steady_samples" not in got:
        return got
    held = last.get("held") or {}
    for k in sorted(held):
        later.hand(job["workdir"], "graph", handed["n"], held[k], set=(k + last["shift"]) % len(sets))
        handed["n"] += 1
    return {"steady_samples": got["steady_samples"], "steady_errors": errors, "graphs": handed["n"]}


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
    from ks_inductor.judge.sandbox import confine_job

    device = job["device"]
    P.stage("load")
    confine_job(job["workdir"])
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
