"""The trusted side of a judgment: jobs that run the problem's reference and nothing else.

A reference job computes the reference's outputs for every trial and timing set of a search (and, for float16 and
bfloat16 outputs, the float64 truth), saves the reference's weights for candidates to start from, and checks that
the reference is a function of its inputs. A baselines job times eager and Inductor on the search's timing sets with
the same protocol a candidate is timed with. Neither ever loads candidate code: a candidate's process holds no
reference model and no reference output it could hand back or hook.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

from ks_inductor.judge import protocol as P


def run_reference(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge.inputs import build_model, make_inputs
    from ks_inductor.judge.scratch import fit_trials

    device = job["device"]
    P.stage("load")
    mod = exec_problem_source(job["problem_source"], "<problem>")
    model = build_model(mod, "Model", job["init_seed"], device)
    P.stage("correctness")
    P.acquire("shared")
    n_trials, n_sets = len(job["trials"]), len(job["timing_sets"])
    runs = [tuple(t) for t in job["trials"]] + [tuple(t) for t in job["timing_sets"]]
    repeat_file = os.path.join(job["workdir"], "ref_repeat.safetensors")
    wide: dict[str, Any] = {}  # the float64 copy of the model, made once for every run that needs it (``_truth``)

    def run(i: int) -> tuple[dict[str, Any], int]:
        seed, dist = runs[i]
        with torch.no_grad():
            try:
                outs = P.as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
            except RuntimeError:
                if dist != "nan":
                    raise
                # The problem refuses NaN (sampling from probabilities, say): judge this trial on its own inputs.
                dist = "native"
                outs = P.as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
            finite = all(torch.isfinite(o).all().item() for o in outs if o.is_floating_point())
            if not finite and dist not in ("native", "nan"):
                # This distribution is outside the problem's domain (log of negatives, overflow); fall back to the
                # problem's own inputs for this trial rather than compare NaN with NaN.
                dist = "native"
                outs = P.as_outputs(model(*make_inputs(mod, job["specs"], seed, dist, device)))
                finite = all(torch.isfinite(o).all().item() for o in outs if o.is_floating_point())
        bad_types = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
        if bad_types:
            raise TypeError(f"reference returned non-tensor outputs {bad_types}")
        # Inputs drawn afresh, not the ones just used: a reference may have changed its own in place.
        truth = _truth(model, outs, lambda: make_inputs(mod, job["specs"], seed, dist, device),
                       os.path.join(job["workdir"], f"truth_{i}.safetensors"), wide, nan_inputs=dist == "nan")
        if i == 0:
            def again() -> list[Any]:
                inputs = make_inputs(mod, job["specs"], seed, dist, device)
                # Drawing native inputs seeds the global RNG, which would replay a dropout's mask; a reference
                # that is a function of its inputs does not notice the RNG's state.
                torch.manual_seed(seed + 7919)
                return P.as_outputs(model(*inputs))

            _repeat_sample(outs, again, repeat_file)
        path = os.path.join(job["workdir"], f"ref_{i}.safetensors")
        P.save(path, outs)
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
    P.release("shared")
    return {"trials": results[:kept_trials], "timing": results[kept_trials:], "out_bytes": out_bytes,
            "repeat_file": repeat_file, "state_file": save_state(model, os.path.join(job["workdir"], "state"))}


def save_state(model: Any, path: str) -> str | None:
    """The reference's weights and buffers, for a candidate's ModelNew to start from where it holds the same ones
    (``candidate_job.kernel_model``); None for a model without any. Tied tensors are saved once per name."""
    import torch
    from safetensors.torch import save_file

    state = model.state_dict() if hasattr(model, "state_dict") else {}
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        return None
    save_file(tensors, path + ".safetensors")
    return path + ".safetensors"


def peer_baseline(name: str, spec: str | None, model: Any, inputs: list[Any], device: str) -> tuple[Any, str]:
    """The baseline ``name`` made by its factory (``JudgeConfig.peers``: ``"module:function"``, called with the
    reference model and one set of inputs), checked to compute what the reference computes on them; or None and
    why it is left out."""
    import importlib

    import torch

    if not spec or ":" not in spec:
        return None, f"no factory makes the {name} baseline (JudgeConfig.peers names none)"
    module, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
        with torch.no_grad():
            tool = factory(model, inputs)
            if tool is None:
                return None, f"{spec} has no kernel for this problem"
            got, want = tool(*inputs), model(*inputs)
        P.sync(device)
    except Exception as e:  # noqa: BLE001 - a stack's kernel that cannot run here is left out and said
        return None, f"{spec}: {type(e).__name__}: {str(e)[:300]}"
    got, want = P.as_outputs(got), P.as_outputs(want)
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or not torch.allclose(
                g.float(), w.float(), atol=2e-2, rtol=2e-2, equal_nan=True):
            return None, f"{spec} computes something other than the reference; not timed"
    if len(got) != len(want):
        return None, f"{spec} returns {len(got)} outputs where the reference returns {len(want)}; not timed"
    return tool, ""


def run_baselines(job: dict[str, Any]) -> dict[str, Any]:
    """Time the baselines (eager, Inductor) on the search's timing sets with the protocol in ``job["timing"]``: per
    call with a flushed L2 and refreshed inputs, then inside a CUDA graph over cold sets where asked. The same loops
    time a candidate in its own process (``candidate_job``), so their samples compare as if interleaved in one."""
    import torch

    from ks_core.problem_record import exec_problem_source
    from ks_inductor.judge import timing as T
    from ks_inductor.judge.inputs import build_model, make_inputs

    device, cfg = job["device"], job["timing"]
    P.stage("load")
    mod = exec_problem_source(job["problem_source"], "<problem>")
    model = build_model(mod, "Model", job["init_seed"], device)
    P.stage("correctness")
    P.acquire("shared")
    sets = [make_inputs(mod, job["specs"], seed, dist, device) for seed, dist in job["timing_sets"]]
    active = [x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]]
    P.release("shared")
    tools: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if "eager" in cfg["baselines"]:
        tools["eager"] = model
    if "inductor" in cfg["baselines"]:
        P.stage("compile", label="inductor")
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*active)
            P.sync(device)
            tools["inductor"] = compiled
        except Exception as e:  # noqa: BLE001 - a baseline Inductor cannot build is left out and said
            errors["inductor"] = f"{type(e).__name__}: {str(e)[:300]}"
    for name in cfg["baselines"]:
        if name not in ("eager", "inductor"):
            P.stage("compile")
            tool, why = peer_baseline(name, (cfg.get("peers") or {}).get(name), model, active, device)
            if tool is not None:
                tools[name] = tool
            else:
                errors[name] = why
    before_each = T.refresher(active, sets, job["output_specs"], device)
    fns = {name: (lambda f=f: f(*active)) for name, f in tools.items()}
    leads: dict[str, Any] = {}
    graph_leads: dict[str, Any] = {}
    P.acquire("exclusive")
    P.stage("timing")
    try:
        flush = T.make_l2_flush(device, job.get("l2_bytes", 0))
        with torch.no_grad():
            samples = T.benchmark_interleaved(
                fns, rounds=cfg["rounds"], warmup_ms=cfg["warmup_ms"], rep_ms=cfg["rep_ms"],
                min_reps=cfg["min_reps"], max_reps=cfg["max_reps"], before_each=before_each,
                seed=job["order_seed"], device=device, flush=flush, leads=leads)
            steady: dict[str, Any] = {}
            if cfg.get("steady") and device != "cpu":
                steady = T.steady_state_samples(job, tools, sets, device, leads=graph_leads)
            # The floor's rates, measured beside the baselines (under the same lock, clocks and neighbours).
            bandwidth = T.measure_copy_bandwidth(device, (512 if device != "cpu" else 64) * 2**20)
            flops_rate = None
            if job.get("flops_dtype"):
                flops_rate = T.measure_matmul_peak(device, getattr(torch, job["flops_dtype"]),
                                                   8192 if device != "cpu" else 512, tf32=bool(job.get("tf32")))
            launch_ms = T.measure_launch_ms(device, flush)
    finally:
        P.release("exclusive")
    return {"samples": samples, "errors": errors, "bandwidth": bandwidth, "flops_rate": flops_rate,
            "launch_ms": launch_ms, "leads": T.lead_report(leads, graph_leads), **steady}


# Low-precision outputs get a float64 rerun of the reference (``_truth``) up to this many bytes of outputs a run.
TRUTH_MAX_OUT_BYTES = 256 << 20


def _truth(model: Any, outs: list[Any], inputs: Any, path: str, wide: dict[str, Any],
           nan_inputs: bool = False) -> str | None:
    """The reference's outputs computed once more in float64 (the model's floating parameters and inputs cast up),
    saved in float32 to ``path``, where any output is float16 or bfloat16; None otherwise, or where the model does
    not run in float64. The judge holds a low-precision output to the float64 result as well as to eager's: an
    element that differs from eager's by more than the tolerance passes if it is no further from the float64 result
    than eager's own, within the tolerance (eager rounds after every op, and a fused kernel that keeps fp32
    intermediates, Inductor's own, differs from it by several units in the last place where terms cancel).
    ``wide`` keeps the float64 copy of ``model`` across runs (None once it could not be made).

    With ``nan_inputs`` (the NaN-input trial and timing sets) the rerun is made for outputs of any floating dtype,
    with cuDNN and oneDNN off: their convolutions skip the taps that fall on padding, so a NaN weight never meets a
    padding zero there, while the native im2col convolution multiplies every tap as a Triton kernel does, and
    0 * NaN is NaN; and with attention's math backend, for the same reason (``_every_tap_multiplied``). The judge
    accepts a candidate's NaN where eager has a number only where this rerun has NaN (``compare.compare_outputs``):
    a NaN input reaches that element in a plain evaluation of the model."""
    import copy

    import torch

    low = (torch.float16, torch.bfloat16)
    wanted = ((lambda o: o.is_floating_point()) if nan_inputs else (lambda o: o.dtype in low))
    if not any(isinstance(o, torch.Tensor) and wanted(o) for o in outs):
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
        with torch.no_grad(), (_every_tap_multiplied() if nan_inputs else contextlib.nullcontext()):
            got = P.as_outputs(wide["model"](*args))
        del args
    except failures:
        return None  # an op without float64 support, or a model tied to its dtype: eager's outputs alone decide
    if len(got) != len(outs) or any(not isinstance(g, torch.Tensor) or g.shape != o.shape
                                    for g, o in zip(got, outs)):
        return None
    for g, o in zip(got, outs):
        if wanted(o) and not _rounding_apart(o, g):
            return None  # not eager's rounding: randomness, or a model that is not the same function in float64
    P.save(path, [g.to(torch.float32) if g.is_floating_point() else g for g in got])
    return path


@contextlib.contextmanager
def _every_tap_multiplied() -> Iterator[None]:
    """cuDNN and oneDNN off, for the convolutions that compute every tap of the window, padding included; and
    attention by its math backend, which scores every key: a fused attention skips masked keys, and over a single
    key returns its value whatever its score (NaN included), where the softmax of a NaN score is NaN."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's flags warn about TF32 on builds without Intel GPU support
        with torch.backends.cudnn.flags(enabled=False), torch.backends.mkldnn.flags(enabled=False), \
                sdpa_kernel(SDPBackend.MATH):
            yield


# Eager's low-precision outputs and the float64 rerun's differ by rounding alone where their relative L2 distance is
# under this (bfloat16's own spacing is 2**-8 relative); anything further apart gets no float64 result.
TRUTH_MAX_REL_L2 = 1e-2


def _rounding_apart(low: Any, wide: Any) -> bool:
    import torch

    a, b = low.detach().to(torch.float32), wide.detach().to(torch.float32)
    if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
        # Where either side is NaN or inf the comparison holds positions itself; the rest must still agree.
        both = torch.isfinite(a) & torch.isfinite(b)
        a, b = torch.where(both, a, 0.0), torch.where(both, b, 0.0)
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


