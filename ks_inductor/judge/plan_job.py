"""The trusted side of a candidate's judgment: its launch plan executed, checked and timed where no candidate Python
runs.

The candidate's own process (``candidate_job.run_record``, sandboxed) only records what its forward launches. This
job gets that plan (``plan.py``), builds the candidate's kernels from its source (``kernel_source.py``), and runs
every trial, every timed call and every re-check itself, with inputs made here from seeds the candidate's process
never held. Each output goes to the judge's process, which compares it with the reference's (``service._Streamed``).

The timed calls get fresh input contents before every call (drawn here, from the timing sets' distributions), so a
result kept from an earlier call, in device memory or anywhere else, can never be the answer; a few of them, at
random positions the kernels cannot tell apart from the rest, get a timing set's contents instead, and their outputs
go to the judge. Every timing set is checked once more after timing, at the addresses the timed calls used.

The kernels are compiled here, into a Triton cache that only these jobs write (``Judge.trusted_cache``), so the
binary that runs is the one Triton makes from the source, never one a candidate's process left behind.

The job holds, while a plan runs: the inputs, the plan's storages, the model's tensors the plan carries and the
outputs. No reference output, no seed of a trial still to come, no baseline: a kernel that reads the process's whole
device memory finds nothing it could use. The worker confines itself like a candidate's (the interpreter runs kernel
bodies as Python), in a folder of its own that the candidate's process never saw.
"""

from __future__ import annotations

import os
import random
import types
from typing import Any

from ks_inductor.judge import protocol as P

# Sets whose CUDA-graph outputs go to the judge after each timed replay, besides every set of the last replay: a
# result kept across replays is wrong in every set, since every replay brings new contents.
GRAPH_CHECKS_PER_REPLAY = 2
# Largest plan file read (a plan of MAX_STEPS launches with many arguments fits well within it).
PLAN_BYTES = 16 << 20
# The plan's tensors (the model's own, carried as bytes, and small constants) may take the model's weights this many
# times over (a kernel may keep them in another layout or dtype), plus this many bytes.
STATE_TIMES, STATE_SLACK = 4, 64 << 20


def state_bytes_cap(model_bytes: int) -> int:
    """The largest plan state file taken for a model whose weights file has ``model_bytes``."""
    return STATE_TIMES * max(0, model_bytes) + STATE_SLACK


# The share of timed calls that get a timing set's contents and are checked; each set is used at most once there.
CHECKED_SHARE = 0.125


def load_runner(job: dict[str, Any], n_inputs: int) -> Any:
    """The plan in the job's folder, with the candidate's kernels built from its source, ready to run."""
    from safetensors.torch import load_file

    from ks_inductor.judge.kernel_source import kernels_module
    from ks_inductor.judge.plan import PLAN_FILE, STATE_FILE, Plan, PlanError, PlanRunner
    from ks_inductor.source_module import load_source_module

    path = os.path.join(job["workdir"], PLAN_FILE)
    if not os.path.isfile(path) or os.path.getsize(path) > PLAN_BYTES:
        raise PlanError("the candidate's process left no plan of a readable size")
    with open(path, encoding="utf-8") as f:
        plan = Plan.from_json(f.read())
    state_path = os.path.join(job["workdir"], STATE_FILE)
    payload = load_file(state_path) if os.path.isfile(state_path) else {}
    kernels = load_source_module(kernels_module(job["candidate_source"]), "ks_kernels", job["workdir"])
    return PlanRunner(plan, kernels, payload, job["device"], n_inputs)


def run_plan(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge.candidate_job import check_output_objects
    from ks_inductor.judge.inputs import make_inputs
    from ks_inductor.judge.plan import PlanError
    from ks_inductor.judge.sandbox import confine_job

    device = job["device"]
    flags: list[tuple[str, str]] = []
    P.stage("load")
    problem = exec_problem_source(job["problem_source"], "<problem>")
    # Triton's cache for the kernels built here is the trusted side's own, shared across plans (a search's children
    # mostly differ in launch parameters, not in source): only these jobs write it, and a candidate's process can
    # only read it.
    sandbox = confine_job(job["workdir"], triton_cache=job.get("triton_cache")).summary()
    try:
        runner = load_runner(job, len(job["specs"]))
    except (PlanError, ValueError) as e:
        return {"flags": [("plan", str(e).splitlines()[0][:400])], "sandbox": sandbox}
    if runner.plan.launches() == 0:
        return {"flags": [("no_triton_launch", "forward returned without launching any Triton kernel")],
                "sandbox": sandbox}
    specs = job["specs"]
    out_specs = list(job["output_specs"]) + runner.alloc_specs()
    trials = job["trials"]
    P.stage("compile")
    with torch.no_grad():
        # Compiles the kernels (a GPU) and runs every step once, before the device is held for the trials.
        runner(*make_inputs(problem, specs, trials[0][0], trials[0][1], device))
        P.sync(device)
        P.poison(out_specs, device)
    P.stage("correctness")
    later = P.Deliveries(P.STASH_BYTES)
    P.acquire("shared")
    for i, (seed, dist) in enumerate(trials):
        inputs = make_inputs(problem, specs, seed, dist, device)
        saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            P.poison(out_specs, device, wait=False)
            outs = runner(*inputs)
            P.sync(device)
        P.mark("checks")
        for j, (a, b) in enumerate(zip(inputs, saved)):
            if not P.bitwise_equal(a, b):
                flags.append(("inputs_modified", f"trial {i}: the candidate's kernels changed input {j} in place"))
        flags.extend(check_output_objects(outs, device))
        del inputs, saved
        P.mark("stash")
        later.hand(job["workdir"], "trial", i, outs)
        del outs
        P.mark("correctness")
    P.release("shared")
    later.flush()
    result: dict[str, Any] = {"sandbox": sandbox, "launches_per_call": [runner.plan.launches()] * len(trials)}
    if job.get("timing"):
        result.update(_timing(job, problem, runner, flags, device, out_specs))
    result["flags"] = flags
    result["launches"] = dict(runner.counts)
    return result


def _timing(job: dict[str, Any], problem: types.ModuleType, runner: Any, flags: list[tuple[str, str]], device: str,
            out_specs: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    from ks_inductor.judge import timing as T
    from ks_inductor.judge.inputs import make_inputs, same_layout

    cfg = job["timing"]
    specs = job["specs"]
    P.mark("timing_setup")
    sets = [make_inputs(problem, specs, seed, dist, device) for seed, dist in job["timing_sets"]]
    active = [same_layout(x) for x in sets[0]]
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    unused = list(range(len(sets)))
    rng.shuffle(unused)
    later = P.Deliveries(P.STASH_BYTES)
    held: dict[str, Any] = {"outs": None, "set": None, "checked": 0}

    def hand_checked() -> None:
        if held["set"] is not None and held["outs"] is not None:
            later.hand(job["workdir"], "timed", held["checked"], held["outs"], set=held["set"])
            held["checked"] += 1
        held["set"] = held["outs"] = None

    def before_each(i: int) -> None:
        hand_checked()
        if unused and rng.random() < CHECKED_SHARE:
            k = unused.pop()
            contents = sets[k]
            held["set"] = k
        else:
            # A distribution drawn at random too: one tied to the call's position would tell a kernel that counts its
            # calls which ones hold a timing set's contents.
            _, dist = job["timing_sets"][rng.randrange(len(sets))]
            contents = make_inputs(problem, specs, rng.getrandbits(62), dist, device)
        for a, s in zip(active, contents):
            if isinstance(a, torch.Tensor):
                a.copy_(s)
        P.poison(out_specs, device, wait=False)

    def call() -> None:
        held["outs"] = runner(*active)

    fns = {"candidate": call}
    leads: dict[str, Any] = {}
    graph_leads: dict[str, Any] = {}
    mode = "exclusive" if job["timed"] else "shared"
    P.acquire(mode)
    P.stage("timing")
    try:
        with torch.no_grad():
            if job["timed"]:
                samples = T.benchmark_interleaved(
                    fns, rounds=cfg["rounds"], warmup_ms=cfg["warmup_ms"], rep_ms=cfg["rep_ms"],
                    min_reps=cfg["min_reps"], max_reps=cfg["max_reps"], before_each=before_each,
                    seed=job["order_seed"], device=device, flush=T.make_l2_flush(device, job.get("l2_bytes", 0)),
                    leads=leads)
            else:
                samples = T.benchmark_interleaved(
                    fns, rounds=2, warmup_ms=0.0, rep_ms=0.0, min_reps=2, max_reps=2, before_each=before_each,
                    seed=job["order_seed"], device="cpu")
            P.sync(device)
            P.mark("timing_checks")
            hand_checked()
            wall = None
            if job["timed"]:
                # Work hidden on another stream escapes events but not a device-wide sync after each call.
                scratch = torch.empty(1, device=device)
                wall = {"hidden_ms": T.post_enqueue_ms(call, 30, device),
                        "overhead_ms": T.post_enqueue_ms(scratch.zero_, 30, device)}
            # Every timing set once more, at the addresses the timed calls used.
            for k in range(len(sets)):
                for a, s in zip(active, sets[k]):
                    if isinstance(a, torch.Tensor):
                        a.copy_(s)
                P.poison(out_specs, device, wait=False)
                outs = runner(*active)
                P.sync(device)
                later.hand(job["workdir"], "post", k, outs)
                del outs
            steady: dict[str, Any] = {}
            if job["timed"] and cfg.get("steady") and device != "cpu":
                P.mark("steady_state")
                steady = _steady_state(job, runner, sets, flags, device, later, graph_leads)
                P.mark("timing")
    finally:
        P.release(mode)
    later.flush()
    return {"samples": samples, "wall": wall, "timed_checks": held["checked"],
            "leads": T.lead_report(leads, graph_leads), **steady}


def _steady_state(job: dict[str, Any], model: Any, sets: list[list[Any]], flags: list[tuple[str, str]],
                  device: str, later: P.Deliveries, leads: dict[str, Any] | None = None) -> dict[str, Any]:
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

    got = steady_state_samples(job, {"candidate": model}, sets, device, after_replay, leads)
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
