"""The judge's worker process: runs a job (a reference, a candidate, or test vectors) and exits, or, for a search's
judgments, takes the judge's next job while each ends cleanly (``serve``).

Started as ``python -m ks_inductor.judge.worker FD``, or forked from the judge's warm fork server
(``forkserver.py``). It imports torch and triton, says ``ready`` on FD, then reads a JSON job from stdin and installs
the runtime guards for it. Progress (stage changes, requests for the device's timing
lock, each output handed over for the judge to compare) and the result go out on FD as JSON lines; tensors go to
safetensors files in the job's folder. Anything the candidate prints lands in the worker's log, never in the
protocol.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import random
import sys
import traceback
from typing import Any

_events = None  # the protocol channel (a file object over FD)


def send(msg: dict[str, Any]) -> None:
    _events.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
    _events.flush()  # type: ignore[union-attr]


def stage(name: str, label: str | None = None) -> None:
    """Enter stage ``name`` (its time limit applies); ``label`` names the time spent for the judge's clock where it
    differs from the stage (the Inductor baseline's compile runs under the compile limit)."""
    send({"event": "stage", "stage": name, **({"label": label} if label else {})})


def mark(name: str) -> None:
    """Tell the judge's clock where the time goes from here on, within the current stage."""
    send({"event": "mark", "name": name})


def acquire(mode: str) -> None:
    """Ask the judge for the device: "shared" to compile and check, "exclusive" to time."""
    send({"event": "acquire", "mode": mode})
    if sys.stdin.readline().strip() != "grant":
        raise RuntimeError("device lock not granted")


def release(mode: str) -> None:
    send({"event": "release", "mode": mode})


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        return 1024 * next((int(ln.split()[1]) for ln in f if ln.startswith("VmSize:")), 0)


_vm_at_ready = 0  # the address space before any job: every job's limit counts from it


def _set_memory_limit(limit_mb: int) -> None:
    import resource

    # The same limit for every job of a worker (an unprivileged process cannot raise a hard limit it lowered).
    limit = (_vm_at_ready or _vm_bytes()) + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _as_outputs(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)] if all(
            isinstance(o, torch.Tensor) or o is None for o in out) else list(out)
    return [out]


def _save(path: str, outs: list[Any]) -> None:
    from safetensors.torch import save_file

    save_file({f"out{i}": o.detach().to("cpu").contiguous() for i, o in enumerate(outs)}, path)


class Stop(Exception):
    """The judge has seen an output it rejects: the job ends here."""


def deliver(workdir: str, kind: str, index: int, outs: list[Any], **extra: Any) -> None:
    """Hand one output to the judge, which compares it with the reference and deletes the file before it answers,
    so at most one of a candidate's outputs is on disk at a time (KernelBench's run to 8.6 GB each)."""
    _save(os.path.join(workdir, f"{kind}_{index}.safetensors"), outs)
    send({"event": "output", "kind": kind, "index": index, **extra})
    reply = sys.stdin.readline().strip()
    if reply == "stop":
        raise Stop
    if reply != "next":
        raise RuntimeError(f"the judge did not take output {kind} {index}")


# Host memory the outputs of one run may wait in until the device is released (see Deliveries).
STASH_BYTES = 1 << 30
# Input sets whose CUDA-graph outputs are compared after each timed replay of the candidate (``_steady_state``).
GRAPH_CHECKS_PER_REPLAY = 4


class Deliveries:
    """Outputs produced while the device is held (shared or alone), handed to the judge once it is released.

    Writing an output and waiting for the judge's comparison is host work; done under the exclusive lock it keeps
    every other judgment off the device for nothing. Each output is copied to host memory as it is produced (the
    candidate's later calls cannot reach the copies: the static rules keep gc, inspect, frames and dunder access out
    of its source, and a thread it starts is flagged), up to ``limit`` bytes in all; past that an output is handed
    over at once, as when outputs are too large to keep."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.waiting: list[tuple[str, str, int, list[Any], dict[str, Any]]] = []

    def hand(self, workdir: str, kind: str, index: int, outs: list[Any], **extra: Any) -> None:
        size = sum(o.numel() * o.element_size() for o in outs if hasattr(o, "element_size"))
        if self.used + size > self.limit:
            deliver(workdir, kind, index, outs, **extra)
            return
        self.used += size
        host = [o.detach().to("cpu", copy=True) if hasattr(o, "detach") else o for o in outs]
        self.waiting.append((workdir, kind, index, host, extra))

    def flush(self) -> None:
        while self.waiting:
            workdir, kind, index, outs, extra = self.waiting.pop(0)
            deliver(workdir, kind, index, outs, **extra)


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def _poison(outs_like: list[dict[str, Any]], device: str) -> None:
    """Fill freed allocator blocks of the outputs' sizes with NaN, so a candidate returning uninitialized memory
    (that once held a reference result) returns garbage instead."""
    import torch

    junk = []
    for spec in outs_like:
        t = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device=device)
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(-7)
        junk.append(t)
    _sync(device)
    del junk


def _bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    if not isinstance(a, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def run_reference(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ks_inductor.judge.inputs import build_model, make_inputs
    from ks_inductor.judge.scratch import fit_trials
    from ks_inductor.problem import exec_problem_source

    device = job["device"]
    stage("load")
    mod = exec_problem_source(job["problem_source"], "<problem>")
    model = build_model(mod, "Model", job["init_seed"], device)
    stage("correctness")
    acquire("shared")
    n_trials, n_sets = len(job["trials"]), len(job["timing_sets"])
    runs = [tuple(t) for t in job["trials"]] + [tuple(t) for t in job["timing_sets"]]
    repeat_file = os.path.join(job["workdir"], "ref_repeat.safetensors")
    wide: dict[str, Any] = {}  # the float64 copy of the model, made once for every run that needs it (``_truth``)

    def run(i: int) -> tuple[dict[str, Any], int]:
        seed, dist = runs[i]
        with torch.no_grad():
            try:
                outs = _as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
            except RuntimeError:
                if dist != "nan":
                    raise
                # The problem refuses NaN (sampling from probabilities, say): judge this trial on its own inputs.
                dist = "native"
                outs = _as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
            finite = all(torch.isfinite(o).all().item() for o in outs if o.is_floating_point())
            if not finite and dist not in ("native", "nan"):
                # This distribution is outside the problem's domain (log of negatives, overflow); fall back to the
                # problem's own inputs for this trial rather than compare NaN with NaN.
                dist = "native"
                outs = _as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
                finite = all(torch.isfinite(o).all().item() for o in outs if o.is_floating_point())
        bad_types = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
        if bad_types:
            raise TypeError(f"reference returned non-tensor outputs {bad_types}")
        # Inputs drawn afresh, not the ones just used: a reference may have changed its own in place.
        truth = _truth(model, outs, lambda: make_inputs(mod, job["specs"], seed, dist, device),
                       os.path.join(job["workdir"], f"truth_{i}.safetensors"), wide)
        if i == 0:
            def again() -> list[Any]:
                inputs = make_inputs(mod, job["specs"], seed, dist, device)
                # Drawing native inputs seeds the global RNG, which would replay a dropout's mask; a reference
                # that is a function of its inputs does not notice the RNG's state.
                torch.manual_seed(seed + 7919)
                return _as_outputs(model(*inputs))

            _repeat_sample(outs, again, repeat_file)
        path = os.path.join(job["workdir"], f"ref_{i}.safetensors")
        _save(path, outs)
        return ({"seed": seed, "dist": dist, "file": path, "finite": bool(finite), "truth_file": truth,
                 "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", "")} for o in outs]},
                sum(o.numel() * o.element_size() for o in outs))

    first, out_bytes = run(0)
    kept_trials, kept_sets = n_trials, n_sets
    if job.get("scratch"):
        # The first outputs say how large every trial's are; keep only as many as the scratch disk holds.
        # A float64 rerun's outputs, kept in float32, take up to twice a low-precision run's bytes again.
        disk = out_bytes * (3 if first["truth_file"] else 1)
        f = fit_trials(disk, n_trials, n_sets, job["scratch"]["free"], job["scratch"]["in_flight"])
        kept_trials, kept_sets = f.trials, f.sets
    order = list(range(kept_trials)) + [n_trials + k for k in range(kept_sets)]  # starts with run 0, done above
    results = [first] + [run(i)[0] for i in order[1:]]
    release("shared")
    return {"trials": results[:kept_trials], "timing": results[kept_trials:], "out_bytes": out_bytes,
            "repeat_file": repeat_file}


# Low-precision outputs get a float64 rerun of the reference (``_truth``) up to this many bytes of outputs a run.
TRUTH_MAX_OUT_BYTES = 256 << 20


def _truth(model: Any, outs: list[Any], inputs: Any, path: str, wide: dict[str, Any]) -> str | None:
    """The reference's outputs computed once more in float64 (the model's floating parameters and inputs cast up),
    saved in float32 to ``path``, where any output is float16 or bfloat16; None otherwise, or where the model does
    not run in float64. The judge holds a low-precision output to the float64 result as well as to eager's: an
    element that differs from eager's by more than the tolerance passes if it is no further from the float64 result
    than eager's own, within the tolerance (eager rounds after every op, and a fused kernel that keeps fp32
    intermediates, Inductor's own, differs from it by several units in the last place where terms cancel).
    ``wide`` keeps the float64 copy of ``model`` across runs (None once it could not be made)."""
    import copy

    import torch

    low = (torch.float16, torch.bfloat16)
    if not any(isinstance(o, torch.Tensor) and o.dtype in low for o in outs):
        return None
    if sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor)) > TRUTH_MAX_OUT_BYTES:
        return None
    failures = (RuntimeError, TypeError, ValueError, NotImplementedError, MemoryError)
    if "model" not in wide:
        try:
            wide["model"] = copy.deepcopy(model).to(torch.float64)
        except failures:
            wide["model"] = None
    if wide["model"] is None:
        return None
    try:
        args = [a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in inputs()]
        with torch.no_grad():
            got = _as_outputs(wide["model"](*args))
        del args
    except failures:
        return None  # an op without float64 support, or a model tied to its dtype: eager's outputs alone decide
    if len(got) != len(outs) or any(not isinstance(g, torch.Tensor) or g.shape != o.shape
                                    for g, o in zip(got, outs)):
        return None
    for g, o in zip(got, outs):
        if o.dtype in low and not _rounding_apart(o, g):
            return None  # not eager's rounding: randomness, or a model that is not the same function in float64
    _save(path, [g.to(torch.float32) if g.is_floating_point() else g for g in got])
    return path


# Eager's low-precision outputs and the float64 rerun's differ by rounding alone where their relative L2 distance is
# under this (bfloat16's own spacing is 2**-8 relative); anything further apart gets no float64 result.
TRUTH_MAX_REL_L2 = 1e-2


def _rounding_apart(low: Any, wide: Any) -> bool:
    import torch

    a, b = low.detach().to(torch.float32), wide.detach().to(torch.float32)
    if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
        return True  # NaN and inf are held position for position by the comparison itself, never relaxed
    den = float(torch.linalg.vector_norm(b))
    return float(torch.linalg.vector_norm(a - b)) <= TRUTH_MAX_REL_L2 * max(den, 1e-30)


def _repeat_sample(outs: list[Any], again: Any, path: str, per_output: int = 1 << 16) -> None:
    """Run the reference once more on the same inputs and save evenly spaced samples of both runs' outputs, for the
    judge to check that the reference is a function of its inputs (dropout in training mode is not). Samples keep
    the second run's memory and disk cost small on multi-GiB outputs."""
    import torch

    def sample(o: Any) -> Any:
        flat = o.detach().reshape(-1)
        return flat[:: max(1, flat.numel() // per_output)][:per_output].to("cpu").contiguous()

    first = [sample(o) for o in outs]
    with torch.no_grad():
        second = [sample(o) for o in again()]
    from safetensors.torch import save_file

    tensors = {f"a{j}": t for j, t in enumerate(first)}
    tensors.update({f"b{j}": t for j, t in enumerate(second)})
    save_file(tensors, path)


def _load_candidate(source: str, workdir: str) -> Any:
    from ks_inductor.source_module import load_source_module

    # A real file: Triton's JIT reads kernel source through inspect.
    mod = load_source_module(source, "ks_candidate", workdir)
    if not hasattr(mod, "ModelNew"):
        raise LookupError("the candidate defines no ModelNew")
    return mod


def _load_matching_state(model: Any, state: dict[str, Any]) -> None:
    """Give ModelNew the reference's weights when it holds the same parameters (names and shapes), whatever order
    it created them in; otherwise it keeps its own seeded initialisation."""
    own = model.state_dict()
    if state and set(state) == set(own) and all(state[k].shape == own[k].shape for k in state):
        model.load_state_dict(state)


def _kernel_model(mod: Any, ref_mod: Any, ref_model: Any, seed: int, device: str) -> Any:
    """``mod``'s ModelNew built as the reference was (same seed, same init inputs), with the reference's weights
    where it holds the same parameters, on ``device`` in the reference's mode."""
    import torch

    from ks_inductor.judge.inputs import place_model

    torch.manual_seed(seed)
    model = mod.ModelNew(*ref_mod.get_init_inputs())
    _load_matching_state(model, ref_model.state_dict())
    return place_model(model, device)


def _check_output_objects(outs: list[Any], device: str) -> list[tuple[str, str]]:
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
        self.torch_ops: set[str] = set()
        self.launches_per_call: list[int] = []
        self.counter: Any = None  # the Triton launch counter (guards.LaunchCounter), once installed
        self.threads: Any = None  # the thread watch (guards.ThreadWatch), once installed

    def trial_flags(self) -> list[tuple[str, str]]:
        out = []
        if self.torch_ops:
            out.append(("torch_compute", "torch computed during forward: " + ", ".join(sorted(self.torch_ops))))
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
    except Stop:
        # The judge rejected an output; what the guards saw until then still goes into the verdict.
        return {"stopped": True, "flags": _first_of_each(seen.flags + seen.trial_flags())}
    finally:
        # A worker that takes another job installs its guards afresh.
        for guard in (seen.counter, seen.threads):
            if guard is not None:
                guard.uninstall()


def _run_candidate(job: dict[str, Any], seen: _Seen) -> dict[str, Any]:
    import torch

    from ks_inductor.judge import guards
    from ks_inductor.judge.inputs import build_model, make_inputs
    from ks_inductor.problem import exec_problem_source

    device = job["device"]
    flags, torch_ops, launches_per_call = seen.flags, seen.torch_ops, seen.launches_per_call
    counter = seen.counter = guards.LaunchCounter(device)
    counter.install()
    ids_before = guards.identity_snapshot()
    numerics_before = guards.numerics_flags()
    threads = seen.threads = guards.ThreadWatch("ks_candidate")
    threads.install()
    stream_before = guards.current_stream_id(device)
    rng = random.Random(job["order_seed"])

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

    stage("load")
    ref_mod = exec_problem_source(job["problem_source"], "<problem>")
    ref_model = build_model(ref_mod, "Model", job["init_seed"], device)
    model = _kernel_model(_load_candidate(job["candidate_source"], job["workdir"]), ref_mod, ref_model,
                          job["init_seed"], device)
    guard_check("after import")

    trials = job["trials"]
    out_specs = job["output_specs"]
    stage("compile")
    with torch.no_grad():
        warm_inputs = make_inputs(ref_mod, job["specs"], trials[0][0], trials[0][1], device)
        first = model(*warm_inputs)
        _sync(device)
        # Everything a trial does for the first time (library handles the reference loads, the op recorder's
        # dispatch machinery, the poison's allocations) happens here, before the device is held for the trials.
        with guards.TorchOpRecorder():
            _ = ref_model(*warm_inputs)
        _poison(out_specs, device)
        if warm_inputs:
            _bitwise_equal(warm_inputs[0], warm_inputs[0])
    del first, _, warm_inputs
    guard_check("after the first call")
    stage("correctness")
    # The device is held (shared) while the trials compute; their outputs wait in host memory and are handed over
    # after it is released, because writing them and the judge's comparisons are host work that a timing waiting
    # for the device alone should not wait for.
    later = Deliveries(STASH_BYTES)
    acquire("shared")
    for i, (seed, dist) in enumerate(trials):
        inputs = make_inputs(ref_mod, job["specs"], seed, dist, device)
        saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        ref_first = rng.random() < 0.5
        with torch.no_grad():
            if ref_first:
                _ = ref_model(*saved)
                del _
                _poison(out_specs, device)
            else:
                _poison(out_specs, device)
            before = counter.total()
            with guards.TorchOpRecorder() as rec:
                outs = _as_outputs(model(*inputs))
            _sync(device)
            launches_per_call.append(counter.total() - before)
            torch_ops.update(rec.compute_ops())
            if not ref_first:
                _ = ref_model(*saved)
                del _
        mark("checks")
        guard_check(f"trial {i}")
        for j, (a, b) in enumerate(zip(inputs, saved)):
            if not _bitwise_equal(a, b):
                flags.append(("inputs_modified", f"trial {i}: the candidate changed input {j} in place"))
        flags.extend(_check_output_objects(outs, device))
        del inputs, saved
        mark("stash")
        later.hand(job["workdir"], "trial", i, [o for o in outs if isinstance(o, torch.Tensor)])
        del outs
        mark("correctness")
    release("shared")
    later.flush()
    flags.extend(seen.trial_flags())

    result: dict[str, Any] = {"launches": dict(counter.counts), "launches_per_call": launches_per_call}
    if job.get("timing"):
        result.update(_timing(job, ref_mod, ref_model, model, counter, flags, device))
        guard_check("after timing")
    result["flags"] = _first_of_each(flags)
    return result


def _timing(job: dict[str, Any], ref_mod: Any, ref_model: Any, model: Any, counter: Any,
            flags: list[tuple[str, str]], device: str) -> dict[str, Any]:
    import torch

    from ks_inductor.judge import timing as T
    from ks_inductor.judge.inputs import make_inputs

    cfg = job["timing"]
    mark("timing_setup")
    sets = [make_inputs(ref_mod, job["specs"], seed, dist, device) for seed, dist in job["timing_sets"]]
    active = [x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]]

    def rotate(i: int) -> None:
        # Same addresses, new contents every call: a result cached by pointer goes stale and is caught below.
        for a, s in zip(active, sets[i % len(sets)]):
            if isinstance(a, torch.Tensor):
                a.copy_(s)

    tools: dict[str, Any] = {"candidate": model}
    if job["timed"]:
        if "eager" in cfg["baselines"]:
            tools["eager"] = ref_model
        if "inductor" in cfg["baselines"]:
            stage("compile", label="inductor")
            tools["inductor"] = torch.compile(ref_model)
            with torch.no_grad():
                tools["inductor"](*active)
            mark("timing_setup")
    rival_errors = _add_rivals(job, ref_mod, ref_model, tools, active, device)
    fns = {name: (lambda f=f: f(*active)) for name, f in tools.items()}
    # The device alone for a measurement; an untimed run (the interpreter's re-check of rotated inputs) measures
    # nothing, and holding the device alone would only leave a core idle while another judgment waits.
    mode = "exclusive" if job["timed"] else "shared"
    later = Deliveries(STASH_BYTES)
    acquire(mode)
    stage("timing")
    try:
        with torch.no_grad():
            if job["timed"]:
                samples = T.benchmark_interleaved(
                    fns, rounds=cfg["rounds"], warmup_ms=cfg["warmup_ms"], rep_ms=cfg["rep_ms"],
                    min_reps=cfg["min_reps"], max_reps=cfg["max_reps"], before_each=rotate,
                    seed=job["order_seed"], device=device,
                    flush=T.make_l2_flush(device, job.get("l2_bytes", 0)))
            else:
                # The interpreter's clock means nothing; run the same rotating loop briefly so that caching and
                # stateful candidates are still exercised and re-checked.
                samples = T.benchmark_interleaved(
                    fns, rounds=2, warmup_ms=0.0, rep_ms=0.0, min_reps=2, max_reps=2, before_each=rotate,
                    seed=job["order_seed"], device="cpu")
            wall = None
            mark("timing_checks")
            if job["timed"]:
                # Work hidden on another stream escapes events but not a device-wide sync after each call.
                scratch = torch.empty(1, device=device)
                wall = {"hidden_ms": T.post_enqueue_ms(fns["candidate"], 30, device),
                        "overhead_ms": T.post_enqueue_ms(scratch.zero_, 30, device)}
            for k in range(len(sets)):
                rotate(k)
                _poison(job["output_specs"], device)
                outs = _as_outputs(model(*active))
                _sync(device)
                later.hand(job["workdir"], "post", k, outs)
                del outs
            steady: dict[str, Any] = {}
            if job["timed"] and cfg.get("steady") and device != "cpu":
                # The graph's warm-up and capture run on streams of their own, and whatever a candidate records
                # there is timed and checked with the replay; the per-call checks of streams are done by now.
                counter.enabled = False
                mark("steady_state")
                try:
                    steady = _steady_state(job, tools, ref_model, sets, flags, device, later)
                finally:
                    counter.enabled = True
                mark("timing")
            mark("timing_checks")
            bandwidth = T.measure_copy_bandwidth(device, 512 * 2**20) if job["timed"] else None
    finally:
        release(mode)
    later.flush()
    if counter.off_stream and not any(f[0] == "side_stream" for f in flags):
        flags.append(("side_stream", f"{counter.off_stream} Triton launch(es) during timing went to a stream other "
                      "than the current one"))
    return {"samples": samples, "wall": wall, "bandwidth": bandwidth,
            "rival_errors": rival_errors, **steady}


def _add_rivals(job: dict[str, Any], ref_mod: Any, ref_model: Any, tools: dict[str, Any], active: list[Any],
                device: str) -> dict[str, str]:
    """Put the job's rivals (other kernels for the same problem, each judged on its own elsewhere) among the timed
    tools as ``rival0``, ``rival1``, ...: timed in the same interleaved rounds and graphs as the candidate, so that
    an optimizer's final choice among its leaders is made head to head rather than across separate processes.
    A rival that raises while loading or on its first call is left out and reported. Rivals load after the
    candidate's checks and before the last guard check, so whatever one changes globally still counts against this
    judgment (never for it), as does a crash of this process."""
    import torch

    from ks_inductor.source_module import load_source_module

    errors: dict[str, str] = {}
    for rival in job.get("rivals") or []:
        name = rival["name"]
        try:
            mod = load_source_module(rival["source"], "ks_rival", os.path.join(job["workdir"], name))
            model = _kernel_model(mod, ref_mod, ref_model, job["init_seed"], device)
            with torch.no_grad():
                model(*active)
            _sync(device)
            tools[name] = model
        except Exception as e:  # noqa: BLE001 - a rival is reported, never fatal to the candidate
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
    return errors


def _steady_state(job: dict[str, Any], tools: dict[str, Any], reference: Any, sets: list[list[Any]],
                  flags: list[tuple[str, str]], device: str, later: Deliveries) -> dict[str, Any]:
    """Time every tool inside a CUDA graph, the way a served model runs it: one call per input set, back to back,
    over sets that together exceed a few times the L2 (``timing.benchmark_graphed``).

    A graph replays whatever was captured, so a candidate that computes only while it is being watched, or that
    learns its inputs once, would look fast here. Before every timed replay the sets get other contents (the
    timing sets, rotated) and the L2 is flushed. After every replay of the candidate its outputs are compared with
    the reference's for those contents, here; those of its last replay also go to files that the judge's own
    process compares."""
    import torch

    from ks_inductor.judge import timing as T
    from ks_inductor.judge.compare import compare_outputs
    from ks_inductor.judge.config import JudgeConfig

    tolerance = JudgeConfig(tolerances={k: tuple(v) for k, v in job["tolerances"].items()}).tolerance
    l2 = job.get("l2_bytes") or T.device_l2_bytes()
    out_bytes = sum(math.prod(o["shape"]) * getattr(torch, o["dtype"]).itemsize for o in job["output_specs"])
    in_bytes = sum(x.numel() * x.element_size() for x in sets[0] if isinstance(x, torch.Tensor))
    count = T.cold_set_count(in_bytes + out_bytes, l2)
    need = T.steady_state_bytes(in_bytes, out_bytes, count, len(sets), len(tools))
    have = T.device_bytes_available(device)
    if have is not None and need > have:
        # Not timing the steady state is the judge's limit, not the candidate's fault: per call it is still timed.
        return {"steady_skipped": f"the CUDA-graph timing needs {need / 2**30:.1f} GiB of device memory on top of "
                                  f"the per-call timing's, and {have / 2**30:.1f} GiB is left"}
    try:
        graph_sets = [[x.clone() if isinstance(x, torch.Tensor) else x for x in sets[k % len(sets)]]
                      for k in range(count)]
        expected = [_as_outputs(reference(*s)) for s in sets]
    except torch.cuda.OutOfMemoryError as e:
        return {"steady_skipped": f"the CUDA-graph timing ran out of device memory setting up: {str(e)[:200]}"}
    held: dict[int, list[Any]] = {}

    def call(f: Any, k: int, keep: bool) -> Any:
        out = f(*graph_sets[k])
        if keep:
            held[k] = _as_outputs(out)
        return out  # kept alive by the timing loop, for every tool alike

    calls = {name: [(lambda f=f, k=k, keep=name == "candidate": call(f, k, keep)) for k in range(count)]
             for name, f in tools.items()}
    flush = T.make_l2_flush(device, l2)
    shift = {"now": 0, "candidate": 0}
    failures: list[str] = []

    def content(k: int, at: int) -> int:
        return (k + at) % len(sets)

    def before_replay(name: str) -> None:
        shift["now"] += 1
        for k, s in enumerate(graph_sets):
            for a, b in zip(s, sets[content(k, shift["now"])]):
                if isinstance(a, torch.Tensor):
                    a.copy_(b)
        flush()

    picker = random.Random(job["order_seed"] + 1)

    def after_replay(name: str) -> None:
        if name != "candidate" or failures:
            return
        shift["candidate"] = shift["now"]
        # Every replay gets new contents in every set, so a result kept across replays is wrong in all of them:
        # a few sets drawn per replay catch it, where comparing all (a hundred, for inputs far smaller than the L2)
        # after each of 35 replays cost seconds of the device held alone. The last replay's sets all go to the judge.
        for k in sorted(picker.sample(range(count), min(count, GRAPH_CHECKS_PER_REPLAY))):
            _, why = compare_outputs(expected[content(k, shift["now"])], held[k], tolerance, k, "graph replay")
            if why:
                failures.append(why)
                return

    samples, errors = T.benchmark_graphed(calls, rounds=job["timing"]["rounds"], seed=job["order_seed"],
                                          before_replay=before_replay, after_replay=after_replay)
    if "out of memory" in errors.get("candidate", "").lower():
        return {"steady_skipped": f"the CUDA-graph timing ran out of device memory: {errors['candidate'][:200]}"}
    if "candidate" in errors:
        flags.append(("graph_capture", "the candidate cannot be captured in a CUDA graph, as serving runs kernels: "
                      + errors["candidate"]))
        return {}
    if failures:
        flags.append(("stale_result", f"wrong when replayed in a CUDA graph on new input contents: {failures[0]}"))
        return {}
    for k in range(count):
        later.hand(job["workdir"], "graph", k, held.pop(k), set=content(k, shift["candidate"]))
    return {"steady_samples": samples, "steady_errors": errors, "graphs": count}


def run_vectors(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from ks_inductor.judge import guards
    from ks_inductor.judge.inputs import place_model

    device = job["device"]
    counter = guards.LaunchCounter(device)
    counter.install()
    stage("load")
    cand_mod = _load_candidate(job["candidate_source"], job["workdir"])
    torch.manual_seed(job.get("init_seed", 0))
    model = cand_mod.ModelNew(*job.get("init_inputs", []))
    if job.get("state_file"):
        _load_matching_state(model, load_file(job["state_file"]))
    model = place_model(model, device)
    stage("correctness")
    acquire("shared")
    files, flags = [], []
    for i, path in enumerate(job["input_files"]):
        data = load_file(path)
        inputs = [data[f"in{j}"].to(device) for j in range(len(data))]
        with torch.no_grad(), guards.TorchOpRecorder() as rec:
            outs = _as_outputs(model(*inputs))
        _sync(device)
        if rec.compute_ops():
            flags.append(("torch_compute", "torch computed during forward: " + ", ".join(rec.compute_ops())))
        flags.extend(_check_output_objects(outs, device))
        out_path = os.path.join(job["workdir"], f"vec_out_{i}.safetensors")
        _save(out_path, outs)
        files.append(out_path)
    release("shared")
    if counter.total() == 0:
        flags.append(("no_triton_launch", "forward returned without launching any Triton kernel"))
    return {"cand_files": files, "flags": flags, "launches": dict(counter.counts)}


def preload(warm: bool = False) -> None:
    """Imports done before "ready", so that spares (or the fork server) hide them. ``warm`` adds what the first
    candidate call would import anyway: torch._dynamo, which the op recorder's dispatch mode pulls in (1.2-1.6 s)."""
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    import ks_inductor.judge.guards  # noqa: F401
    import ks_inductor.judge.inputs  # noqa: F401
    import ks_inductor.problem  # noqa: F401

    if warm:
        import torch._dynamo  # noqa: F401


def preload_for_fork() -> None:
    """The fork server's imports (``forkserver.py``): everything a candidate's first call would import."""
    preload(warm=True)


def main() -> None:
    preload(warm=True)
    serve(int(sys.argv[1]))


# Namespaces a job could leave something in for the next: what they hold is compared before and after each job.
_WATCHED = ("builtins", "math", "time", "random", "threading", "torch", "torch.cuda", "torch.nn", "torch.nn.functional",
            "torch.library", "triton", "triton.language", "ks_inductor.judge.guards", "ks_inductor.judge.inputs",
            "ks_inductor.judge.timing", "ks_inductor.judge.worker", "ks_inductor.problem")
_WATCHED_CLASSES = ("torch.Tensor", "torch.nn.Module", "torch.cuda.Event", "threading.Thread")


def namespace_state() -> dict[str, int]:
    """Every name in the watched modules and classes, with the identity of what it holds where that is code or a
    class (values such as counters may change; code must not). A submodule bound by a later import is not a change."""
    import types

    def entries(prefix: str, ns: Any) -> dict[str, int]:
        return {f"{prefix}.{k}": (id(v) if callable(v) or isinstance(v, type) else 0)
                for k, v in list(ns.items()) if not isinstance(v, types.ModuleType)}

    state: dict[str, int] = {}
    for name in _WATCHED:
        mod = sys.modules.get(name)
        if mod is not None:
            state.update(entries(name, vars(mod)))
    for dotted in _WATCHED_CLASSES:
        mod_name, _, cls_name = dotted.rpartition(".")
        cls = getattr(sys.modules.get(mod_name), cls_name, None)
        if isinstance(cls, type):
            state.update(entries(dotted, vars(cls)))
    return state


_state_before: dict[str, int] = {}


def _fit_for_another(job: dict[str, Any], result: dict[str, Any]) -> bool:
    """Whether this worker may take the judge's next job: the judge asked for reuse, the job ended cleanly (nothing
    flagged, not stopped on a wrong output), left the watched namespaces as it found them, and its address space
    has not grown by half the memory limit."""
    if not job.get("reusable") or result.get("flags") or result.get("stopped"):
        return False
    after = namespace_state()
    changed = sorted(k for k in set(after) | set(_state_before) if after.get(k) != _state_before.get(k))
    if changed:
        logging.getLogger(__name__).warning("not taking another job; the last one changed %s", ", ".join(changed[:5]))
        return False
    return _vm_bytes() - _vm_at_ready < job["memory_limit_mb"] * 2**19


def _between_jobs(home: str) -> None:
    """Forget the last job: its candidate's module, its objects, its cached device memory."""
    import gc

    import torch

    for name in [n for n in sys.modules if n.startswith("ks_candidate")]:
        del sys.modules[name]
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    os.chdir(home)  # the job's folder is the judge's to delete


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


def serve(events_fd: int) -> None:
    """Say ready on ``events_fd``, then run the jobs that come on stdin: one, or more while the judge asks for reuse
    (``reusable`` in a job; search judgments only, see ``JudgeConfig.jobs_per_worker``) and each ends cleanly. A
    kept worker says ready again once it has forgotten its last job."""
    global _events, _vm_at_ready, _state_before
    import torch

    _events = os.fdopen(events_fd, "w")
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        # A GPU worker makes its device context before it says ready: a spare does it while it waits, off the
        # judgment's path, where contexts made by many workers at once queue in the driver.
        torch.cuda.init()
        torch.empty(1, device="cuda")
    home = os.getcwd()
    _vm_at_ready = _vm_bytes()
    send({"event": "ready", "pid": os.getpid()})
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        job = json.loads(line)
        os.chdir(job["workdir"])
        if job.get("reusable"):
            _state_before = namespace_state()
        try:
            if job["device"] == "cpu":
                _set_memory_limit(job["memory_limit_mb"])
            else:
                torch.cuda.set_per_process_memory_fraction(job["device_memory_fraction"])
            handler = {"reference": run_reference, "candidate": run_candidate, "vectors": run_vectors}[job["kind"]]
            result = handler(job)
            again = _fit_for_another(job, result)
            send({"event": "result", "ok": True, "reusable": again, **result})
        except BaseException as e:  # noqa: BLE001 - everything becomes a structured verdict
            with contextlib.suppress(Exception):
                send(_failure(e))
            # Whatever happened, this process is retired: a CUDA error poisons the context for good.
            os._exit(3)
        if not again:
            os._exit(0)
        try:
            _between_jobs(home)
        except BaseException:  # noqa: BLE001 - a worker that cannot forget its last job takes no other
            os._exit(0)
        # Only now may the judge hand this process the next job (``WorkerPool.take``): one that dies or hangs
        # while forgetting the last job never says it, so no later candidate is charged with its end.
        send({"event": "ready", "pid": os.getpid()})


if __name__ == "__main__":
    main()
