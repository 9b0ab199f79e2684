"""The Judge: static checks, then the reference, the baselines and the candidate each in a worker of its own, then
the verdict here. The reference's outputs and the baselines' timings are made once per problem (the baselines once
more for final judgments when they are older than ``FINAL_BASELINES_FRESH_S``) and serve every candidate; a candidate's
worker holds only the candidate."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ks_core.fingerprint import EnvFingerprint
from ks_core.problem_record import Problem
from ks_inductor.candidate import normalized_source_hash
from ks_inductor.judge.admission import ALONE, GATE_SHARE, input_bytes, job_bytes, output_bytes
from ks_inductor.judge.backends import JudgeBackend, detect_backend
from ks_inductor.judge.clock import StageClock
from ks_inductor.judge.compare import compare_outputs
from ks_inductor.judge.config import JudgeConfig
from ks_inductor.judge.guards import compute_ops
from ks_inductor.judge.inputs import trial_plan
from ks_inductor.judge.pool import JobOutcome, WorkerPool
from ks_inductor.judge.room import COMPUTE_OPS, Room, compute_dtype, floor_ms, tf32_rate
from ks_inductor.judge.scratch import shortfall_note
from ks_inductor.judge.static_checks import static_check
from ks_inductor.judge.verdict import (
    ACCEPTED,
    DEADLINE_ERROR,
    ERROR,
    QUARANTINED,
    REJECTED,
    EvalResult,
)

log = logging.getLogger(__name__)

# Outputs of at least this many bytes are compared on the judge's GPU (``_Streamed._compare``).
DEVICE_COMPARE_BYTES = 32 << 20
# A candidate whose device time per call is within this many measured kernel launches is launch-bound
# (``EvalResult.launch_bound``).
LAUNCH_BOUND_LAUNCHES = 4
COST_SAMPLES = 50  # judgments per protocol that ``Judge.typical_cost`` takes its medians over
# A final judgment's baselines are timed again when older than this: what gets stored is compared with baselines
# timed close to it, while the leaders judged together share one timing of them.
FINAL_BASELINES_FRESH_S = 120.0
# A problem with at least this many bytes of inputs has its reference computed alone (``_reference``), and a
# reference holding this much scratch disk is dropped when its search is done (``release``).
SCRATCH_SERIAL_BYTES = 256 * 2**20
# Distributions of the timing sets, in turn: the re-check after timing sees NaN, large and shifted inputs too.
TIMING_DISTRIBUTIONS = ("normal", "nan", "large", "normal_shifted")

# Runtime findings that make a candidate wrong or untrustworthy, whatever its outputs.
_REJECTING_FLAGS = frozenset({
    "torch_compute", "no_triton_launch", "monkeypatch", "global_config_change", "thread_injection", "side_stream",
    "inputs_modified", "lazy_evaluation", "wrong_device", "stale_result", "graph_capture", "plan",
})


class _Reference:
    def __init__(self, trials: list[dict[str, Any]], timing: list[dict[str, Any]], note: str = "",
                 out_bytes: int = 0, state_file: str | None = None, per_draw: int = 0, work: str = "") -> None:
        self.work = work  # the folder holding its files
        # Two draws of every configured trial, the second draws after all the first, as many as the disk holds.
        self.trials = trials
        self.timing = timing
        self.note = note  # why fewer trials or timing sets than configured, if so
        self.out_bytes = out_bytes  # one trial's outputs
        self.state_file = state_file  # the reference's weights, for a candidate's ModelNew to start from
        self.per_draw = per_draw or len(trials)  # trials in one draw

    def pick_trials(self, rng: random.Random) -> list[int]:
        """The trials one candidate gets, as indices into ``trials``: for each configured trial, one of its draws at
        random, so that no candidate knows which inputs it is checked on while the reference ran once for all."""
        n, kept = self.per_draw, len(self.trials)
        return [rng.choice([j for j in (i, i + n) if j < kept]) for i in range(min(n, kept))]


class _Baselines:
    """The baselines' samples for one problem and protocol, timed by a trusted worker (``reference_job``)."""

    def __init__(self, result: dict[str, Any], at: float) -> None:
        self.samples: dict[str, list[list[float]]] = result.get("samples") or {}
        self.steady: dict[str, list[list[float]]] = result.get("steady_samples") or {}
        self.steady_skipped: str | None = result.get("steady_skipped")
        self.errors: dict[str, str] = {**(result.get("errors") or {}), **(result.get("steady_errors") or {})}
        self.bandwidth: float | None = result.get("bandwidth")
        self.flops_rate: float | None = result.get("flops_rate")
        self.launch_ms: float | None = result.get("launch_ms")
        self.leads: dict[str, dict[str, float]] = result.get("leads") or {}
        self.at = at


def _outputs(saved: dict[str, Any]) -> list[Any]:
    """A run's outputs in order, from the file ``protocol.save`` wrote (``out0``, ``out1``, ...)."""
    return [saved[f"out{j}"] for j in range(len(saved))]


class _Streamed:
    """Compares each output a candidate's worker hands over (``protocol.deliver``) with the reference's, as it comes,
    and deletes the file: the first mismatch stops the worker, and the disk holds one candidate output at a time.
    Paths are built here from the kind and index, never taken from the worker, and each output is taken once."""

    def __init__(self, res: EvalResult, ref: _Reference, work: str, trials: list[tuple[int, str]],
                 picked: list[int], tolerance: Any, compare_device: str | None = None) -> None:
        self.res, self.ref, self.work, self.trials, self.tolerance = res, ref, work, trials, tolerance
        self.compare_device = compare_device  # a GPU of the judge's, for large outputs (``_compare``)
        self.picked = picked  # the reference's trial behind each of the candidate's (``_Reference.pick_trials``)
        self.taken: dict[str, set[int]] = {"trial": set(), "post": set(), "graph": set(), "timed": set()}
        self.stage = "correctness"  # where the first rejected output came from

    def __call__(self, msg: dict[str, Any]) -> bool:
        from safetensors.torch import load_file

        kind, index = msg.get("kind"), msg.get("index")
        if kind not in self.taken or type(index) is not int or index in self.taken[kind]:
            # Nothing named by such a message is touched, let alone deleted.
            self.res.reject("protocol", f"the worker handed over an unexpected output ({kind!r}, {index!r})")
            return False
        path = os.path.join(self.work, f"{kind}_{index}.safetensors")
        try:
            if kind == "trial":
                if not 0 <= index < len(self.trials):
                    self.res.reject("protocol", f"the worker handed over trial {index} of {len(self.trials)}")
                    return False
                expected, label, flag, when = (self.ref.trials[self.picked[index]], self.trials[index][1],
                                               "mismatch", "")
            else:
                at = msg.get("set") if kind in ("graph", "timed") else index
                if not isinstance(at, int) or not 0 <= at < len(self.ref.timing):
                    self.res.reject("protocol", f"the worker handed over {kind} output {index} for set {at!r}")
                    return False
                expected, label, flag = self.ref.timing[at], "rotating", "stale_result"
                when = {"post": "repeated calls on refreshed inputs", "timed": "a timed call",
                        "graph": "CUDA-graph replays on new input contents"}[kind]
            self.taken[kind].add(index)
            self.stage = "correctness" if kind == "trial" else "timing"
            got = load_file(path)
            m, why = self._compare(expected, got, index, label)
            del got
            if why:
                self.res.mismatch = m
                self.res.reject(flag, f"wrong after {when} (results cached or state kept across calls): {why}"
                                if when else why)
                return False
            return True
        except MemoryError:
            self.res.verdict = ERROR
            self.res.error = (f"judge resources: not enough host memory to compare {kind} output {index} with the "
                              "reference's")
            self.res.reasons.append(self.res.error)
            return False
        except Exception as e:  # noqa: BLE001 - an unreadable output is the candidate's failure, not the judge's
            self.res.reject("protocol", f"could not read the worker's {kind} output {index}: {type(e).__name__}: {e}")
            return False
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)


    def _compare(self, expected: dict[str, Any], got: dict[str, Any], index: int,
                 label: str) -> tuple[Any, str | None]:
        """The output compared with the reference's on the judge's GPU where it is large (a 0.5 GB output took about
        0.8 s on the host, with judgments comparing side by side), else, or where the GPU cannot (its memory taken),
        on the host. The float64 rerun is read only where the fast pass needs it."""
        from safetensors.torch import load_file

        size = sum(t.numel() * t.element_size() for t in got.values())
        where = [self.compare_device] if self.compare_device and size >= DEVICE_COMPARE_BYTES else []
        for dev in [*where, "cpu"]:
            try:
                ref_t = _outputs(load_file(expected["file"], device=dev))
                out_t = [t.to(dev) for t in _outputs(got)]
                truth = ((lambda d=dev: _outputs(load_file(expected["truth_file"], device=d)))
                         if expected.get("truth_file") else None)
                return compare_outputs(ref_t, out_t, self.tolerance, index, label, truth=truth)
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError among them
                if dev == "cpu":
                    raise
                log.info("comparing an output on %s failed (%s); compared on the host", dev,
                         str(e).splitlines()[0][:200])
        raise AssertionError("unreachable: the host comparison returns or raises")


def _no_outputs(res: EvalResult) -> Any:
    """The answer to an output handed over by a candidate's own process, which records a plan and nothing else."""

    def refuse(msg: dict[str, Any]) -> bool:
        res.reject("protocol", "the candidate's process handed over an output: it records a launch plan, and only the "
                   "trusted side's outputs are compared")
        return False

    return refuse


class Judge:
    """Evaluates candidates for problems. Thread-safe; ``submit`` runs evaluations concurrently (compiles in
    parallel on the CPU cores, timing one candidate at a time per device)."""

    def __init__(self, config: JudgeConfig | None = None, devices: list[int] | None = None,
                 max_workers: int | None = None, spares: bool = True) -> None:
        self.config = config or JudgeConfig()
        self.backend: JudgeBackend = detect_backend(self.config.backend)
        if self.backend.device == "cpu":
            dev_list: list[int | None] = [None]
            # The interpreter's workers share the host's memory as GPU workers share the device's (admission).
            self._device_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        else:
            import torch

            dev_list = list(devices) if devices is not None else list(range(torch.cuda.device_count()))
            self._device_bytes = int(torch.cuda.get_device_properties(dev_list[0] or 0).total_memory)
        self._secret = self.config.seed if self.config.seed is not None else int.from_bytes(os.urandom(4), "little")
        # The trials' and timing sets' seeds come from a secret of their own: the candidate's process is given the
        # model's init seed (its weights are built as the reference's), from which no input may be derived.
        self._input_secret = (int(hashlib.sha256(f"{self.config.seed}:inputs".encode()).hexdigest()[:8], 16)
                              if self.config.seed is not None else int.from_bytes(os.urandom(4), "little"))
        self._root = tempfile.mkdtemp(prefix="ks-judge-")
        n = max_workers or (2 if self.backend.device == "cpu" else
                            max(2, min((os.cpu_count() or 4) // 2, 8 * len(dev_list))))
        per_device = max(1, n // len(dev_list)) if spares else 0
        self._pool = WorkerPool(self.backend, dev_list, os.path.join(self._root, "logs"), spares=per_device,
                                gate_bytes=int(GATE_SHARE * self._device_bytes))
        self._executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ks-judge")
        # The baselines' jobs, started beside the candidates they serve (never on the judgments' own executor, whose
        # threads would wait on them).
        self._side = ThreadPoolExecutor(max_workers=2 * len(dev_list), thread_name_prefix="ks-judge-baselines")
        self._in_flight = n  # judgments that may each hold one candidate output on the scratch disk
        self._refs: dict[str, _Reference | Exception] = {}
        self._baselines_got: dict[tuple[str, bool], _Baselines] = {}
        self._alone_said: set[str] = set()
        self._sandbox_said = False
        self._ref_locks: dict[str, threading.Lock] = {}
        self._scratch_lock = threading.Lock()
        self._lock = threading.Lock()
        self._fingerprint: EnvFingerprint | None = None
        self._l2 = self.backend.l2_bytes() if self.backend.device != "cpu" else 0
        # Only a CUDA device of the judge's own compares: the interpreter's outputs are on the host already.
        self._compare_device = f"cuda:{dev_list[0] or 0}" if self.backend.device == "cuda" else None
        # What finished judgments cost, per protocol (final or not): (seconds of their own, seconds holding the
        # device alone), the most recent COST_SAMPLES of each.
        self._costs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}

    # ------------------------------------------------------------------ public API
    @property
    def fingerprint(self) -> EnvFingerprint:
        if self._fingerprint is None:
            self._fingerprint = self.backend.fingerprint(0)
        return self._fingerprint

    def typical_cost(self, final: bool) -> tuple[float, float] | None:
        """The median cost of this judge's recent timed judgments with the final protocol (``final``) or the search's:
        seconds of their own (their wall time less waiting for the device and the problem's reference) and seconds
        holding a device alone. None before any has finished."""
        with self._lock:
            seen = list(self._costs[final])
        if not seen:
            return None
        return statistics.median(c[0] for c in seen), statistics.median(c[1] for c in seen)

    def _record_cost(self, res: EvalResult, final: bool) -> None:
        if not res.timings or res.verdict == ERROR:
            return
        with self._lock:
            costs = self._costs[final]
            costs.append((res.own_s, res.device_held_s.get("exclusive", 0.0)))
            del costs[:-COST_SAMPLES]

    @property
    def device_count(self) -> int:
        """Devices the judge spreads its jobs over."""
        return len(self._pool.devices)

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._side.shutdown(wait=True, cancel_futures=True)
        self._pool.close()
        if not self.config.keep_workdir:
            shutil.rmtree(self._root, ignore_errors=True)

    def submit(self, problem: Problem, source: str, timing: bool | None = None,
               final: bool = False, deadline: float | None = None) -> Future[EvalResult]:
        """Judge asynchronously. ``final`` times with the final protocol (``JudgeConfig.final_*``). ``deadline``
        (``time.monotonic``): a judgment not finished by then is abandoned, its worker killed, with an ``error``
        verdict that says so (no verdict on the candidate)."""
        return self._executor.submit(self._guarded, problem, source, timing, final, deadline)

    def prepare(self, problem: Problem, deadline: float | None = None) -> Future[None]:
        """Compute ``problem``'s reference outputs in the background, once (the judgments of the problem reuse
        them): a search calls this before it makes its seeds, so that the reference's worker runs beside the seeds'
        code generation instead of before the first judgment. A failure is kept and reported by the judgments."""
        return self._executor.submit(self._prepare, problem, deadline)

    def _prepare(self, problem: Problem, deadline: float | None) -> None:
        with contextlib.suppress(Exception):  # kept in self._refs (or retried, past a deadline) for the judgments
            if self.backend.timed:
                self._side.submit(self._baselines, problem, False, deadline)
            self._reference(problem, deadline)

    def scratch_bytes(self) -> int:
        """Bytes the judge's scratch folder holds now (references' outputs, candidates' outputs in flight)."""
        total = 0
        for dirpath, _, files in os.walk(self._root):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(dirpath, f))
        return total

    def release(self, problem: Problem) -> None:
        """Drop what the judge keeps for ``problem`` when it holds much scratch disk (its reference's outputs of
        every trial and timing set): a warm of many GB-scale regions would otherwise fill the disk with the regions
        it is done with. A later judgment of the problem computes them again."""
        with self._lock:
            lock = self._ref_locks.setdefault(problem.key, threading.Lock())
        with lock:
            ref = self._refs.get(problem.key)
            if not isinstance(ref, _Reference):
                return
            if ref.out_bytes * (len(ref.trials) + len(ref.timing)) < SCRATCH_SERIAL_BYTES:
                return
            del self._refs[problem.key]
            shutil.rmtree(ref.work, ignore_errors=True)

    def evaluate(self, problem: Problem, source: str, timing: bool | None = None,
                 final: bool = False, deadline: float | None = None) -> EvalResult:
        return self._guarded(problem, source, timing, final, deadline)

    def run_vectors(self, source: str, init_inputs: list[Any],
                    vectors: list[tuple[list[Any], list[Any]]], state: dict[str, Any] | None = None) -> EvalResult:
        """Run untrusted ``source`` in a worker on given CPU input tensors and compare with expected outputs."""
        from safetensors.torch import load_file, save_file

        res = self._new_result(source, "")
        if self._static(res, source):
            return res
        with self._workdir("vec-") as work:
            files, strides = [], []
            for i, (inputs, _) in enumerate(vectors):
                path = os.path.join(work, f"vec_in_{i}.safetensors")
                save_file({f"in{j}": t.contiguous() for j, t in enumerate(inputs)}, path)
                files.append(path)
                # safetensors is dense: the worker lays each input out again as given (a kernel may rely on it)
                strides.append({str(j): list(t.stride()) for j, t in enumerate(inputs) if not t.is_contiguous()})
            state_file = None
            if state:
                state_file = os.path.join(work, "state.safetensors")
                save_file({k: v.contiguous() for k, v in state.items()}, state_file)
            job = {"kind": "vectors", "device": self.backend.device, "workdir": work, "candidate_source": source,
                   "init_inputs": init_inputs, "input_files": files, "input_strides": strides,
                   "state_file": state_file, "memory_limit_mb": self.config.memory_limit_mb,
                   "device_memory_fraction": self.config.device_memory_fraction}
            out = self._run(job)
            if not self._absorb_outcome(res, out):
                return res
            res.stage = "correctness"
            for i, path in enumerate(out.result["cand_files"]):  # type: ignore[index]
                got = load_file(path)
                got_list = _outputs(got)
                m, why = compare_outputs(list(vectors[i][1]), got_list, self.config.tolerance, i, "golden")
                if why:
                    res.mismatch = m
                    res.reject("mismatch", why)
                    return res
            res.trials = len(vectors)
            res.correct, res.verdict, res.stage = True, ACCEPTED, "done"
            return res

    # ------------------------------------------------------------------ internals
    @contextlib.contextmanager
    def _workdir(self, prefix: str) -> Iterator[str]:
        """A job's scratch folder, removed once the job is judged: its output files run to hundreds of MB per
        trial on serving shapes, and a search of a few dozen candidates filled the H200's 64 GiB disk."""
        work = tempfile.mkdtemp(dir=self._root, prefix=prefix)
        try:
            yield work
        finally:
            if not self.config.keep_workdir:
                shutil.rmtree(work, ignore_errors=True)

    def _new_result(self, source: str, key: str) -> EvalResult:
        return EvalResult(backend=self.backend.name, problem_key=key, candidate_hash=normalized_source_hash(source),
                          fingerprint=self.fingerprint.to_json(), timing_meaningful=False)

    def _static(self, res: EvalResult, source: str) -> bool:
        findings = static_check(source)
        if not self.config.static_rules:
            findings = [f for f in findings if f[0] in ("syntax_error", "no_modelnew")]
        for flag, reason in findings:
            res.reject(flag, reason)
        return bool(findings)

    def _guarded(self, problem: Problem, source: str, timing: bool | None, final: bool = False,
                 deadline: float | None = None) -> EvalResult:
        t0 = time.monotonic()
        clock = StageClock()
        try:
            if deadline is not None and t0 >= deadline:
                res = self._new_result(source, problem.key)
                self._past_deadline(res)
            else:
                res = self._judge(problem, source, timing, final, clock, deadline)
                if "out_of_memory" in res.flags:
                    # The jobs sharing the device may have taken the memory this one ran out of (their sizes are
                    # estimates): not the candidate's fault until it runs out of memory alone.
                    log.info("%s: a candidate ran out of device memory beside other jobs; judged again alone",
                             problem.name)
                    res = self._judge(problem, source, timing, final, clock, deadline, alone=True)
                    res.notes.append("judged alone on its device after it ran out of device memory beside other "
                                     "jobs")
        except Exception as e:  # noqa: BLE001 - the judge answers with a verdict, never a traceback
            log.exception("judge failure")
            res = self._new_result(source, problem.key)
            res.verdict, res.error = ERROR, f"judge failure: {type(e).__name__}: {e}"
        res.stage_s = clock.stop()
        res.device_held_s = clock.device_held()
        res.duration_s = time.monotonic() - t0
        self._record_cost(res, final)
        return res

    @staticmethod
    def _past_deadline(res: EvalResult) -> None:
        res.verdict, res.correct = ERROR, False
        res.error = DEADLINE_ERROR
        res.reasons.append(DEADLINE_ERROR)

    def _stage_limits(self) -> dict[str, float]:
        c = self.config
        return {"start": c.compile_timeout_s, "load": c.compile_timeout_s, "compile": c.compile_timeout_s,
                "correctness": c.run_timeout_s, "timing": max(c.run_timeout_s, 300.0)}

    def _run(self, job: dict[str, Any], on_output: Any = None, need: int = 0,
             clock: StageClock | None = None, deadline: float | None = None) -> JobOutcome:
        """Run a job on a fresh worker, which ends with it, once its device has room for the ``need`` bytes it will
        hold beside the jobs running there (``admission``; ``ALONE``: with no other job on its device)."""
        clock = clock or StageClock()
        device = self._pool.pick_device()
        gate = self._pool.job_gates[device]
        with clock.section("device_wait"):
            taken = gate.acquire(need)
        try:
            if deadline is not None and time.monotonic() >= deadline:
                return JobOutcome(None, "start", "deadline", DEADLINE_ERROR)
            with clock.section("worker_start"):
                worker = self._pool.take(device)
            return worker.run_job(job, self._stage_limits(), self.config.memory_limit_mb,
                                  self._pool.device_locks.get(device), on_output, clock, deadline)
        finally:
            gate.release(taken)

    def _need(self, problem: Problem, kind: str, out_bytes: int | None, sets: int) -> int:
        """Device bytes a job of ``kind`` for ``problem`` with ``sets`` timing sets holds (``admission.job_bytes``)."""
        in_b = input_bytes(problem.input_specs)
        need = job_bytes(kind, in_b, out_bytes, sets)
        if need > GATE_SHARE * self._device_bytes / 2 and problem.key not in self._alone_said:
            self._alone_said.add(problem.key)
            log.info("%s: inputs of %.1f GiB; a %s job holds about %.1f GiB, so few share the device", problem.name,
                     in_b / 2**30, kind, need / 2**30)
        return need

    def _problem_seed(self, problem: Problem, secret: int | None = None) -> int:
        """The model's init seed (``secret`` None), or the base of the problem's input seeds (the input secret)."""
        h = int(hashlib.sha256(problem.key.encode()).hexdigest()[:8], 16)
        return ((self._secret if secret is None else secret) ^ h) & 0x7FFFFFFF

    def _input_seed(self, problem: Problem) -> int:
        return self._problem_seed(problem, self._input_secret)

    def _timing_sets(self, problem: Problem) -> list[tuple[int, str]]:
        """(seed, distribution) of the problem's timing sets: the same for the reference, the baselines and every
        candidate, so that the baselines need not wait for the reference's outputs."""
        base = self._input_seed(problem)
        return [(base + 50_000 + k, TIMING_DISTRIBUTIONS[k % len(TIMING_DISTRIBUTIONS)])
                for k in range(self.config.rotating_sets)]

    def _reference(self, problem: Problem, deadline: float | None = None) -> _Reference:
        with self._lock:
            lock = self._ref_locks.setdefault(problem.key, threading.Lock())
        with lock:
            cached = self._refs.get(problem.key)
            if isinstance(cached, Exception):
                raise cached
            if cached is not None:
                return cached
            # A large problem's reference fits its trials to the free scratch disk, which is only known once the
            # references before it have written theirs: those run one at a time.
            serial = self._scratch_lock if input_bytes(problem.input_specs) >= SCRATCH_SERIAL_BYTES else None
            with serial or contextlib.nullcontext():
                return self._compute_reference(problem, deadline)

    def _compute_reference(self, problem: Problem, deadline: float | None) -> _Reference:
        base = self._input_seed(problem)
        n = self.config.trials
        trials = (trial_plan(n, self.config.distributions, base)
                  + trial_plan(n, self.config.distributions, base + 500))
        timing_sets = self._timing_sets(problem)
        work = tempfile.mkdtemp(dir=self._root, prefix="ref-")
        free = shutil.disk_usage(self._root).free
        job = {"kind": "reference", "device": self.backend.device, "workdir": work,
               "problem_source": problem.source, "init_seed": self._problem_seed(problem), "trials": trials,
               "timing_sets": timing_sets, "scratch": {"free": free, "in_flight": self._in_flight},
               "specs": [s.__dict__ for s in problem.input_specs],
               "memory_limit_mb": self.config.memory_limit_mb,
               "device_memory_fraction": self.config.device_memory_fraction}
        out = self._run(job, need=self._need(problem, "reference", None, len(timing_sets)), deadline=deadline)
        if out.failure == "deadline":
            # Not the problem's failure: the next judgment with time left computes it.
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(DEADLINE_ERROR)
        if out.result is None or not out.result.get("ok"):
            detail = out.detail or (out.result or {}).get("error", "")
            if (out.result or {}).get("no_space"):
                detail = self._no_space_message(detail)
            err = RuntimeError(f"the reference failed ({out.failure or 'error'} in stage {out.stage}): {detail}")
            self._refs[problem.key] = err
            raise err
        unstable = self._unstable_reference(out.result.get("repeat_file"))
        if unstable:
            err = RuntimeError(
                f"the reference is not a function of its inputs: two runs on the same inputs differ ({unstable}). "
                "Random operations (dropout in training mode, sampling) leave nothing to compare a kernel with; "
                "make the problem deterministic (dropout p=0, or call eval() in Model.__init__) to judge it")
            self._refs[problem.key] = err
            raise err
        got_trials, got_sets = out.result["trials"], out.result["timing"]
        note = shortfall_note(min(len(got_trials), n), n, len(got_sets), len(timing_sets),
                              int(out.result.get("out_bytes") or 0), free)
        if note:
            log.warning("%s: %s", problem.name, note)
        ref = _Reference(got_trials, got_sets, note, int(out.result.get("out_bytes") or 0),
                         out.result.get("state_file"), per_draw=n, work=work)
        nonfinite = [i for i, t in enumerate(ref.trials) if not t["finite"]]
        if len(nonfinite) == len(ref.trials):
            err = RuntimeError("the reference produces NaN or inf on every trial; the problem cannot be judged")
            self._refs[problem.key] = err
            raise err
        self._refs[problem.key] = ref
        return ref

    def _baselines(self, problem: Problem, final: bool, deadline: float | None = None) -> _Baselines:
        """The baselines timed for ``problem`` with the search's protocol or the final one: once per problem for the
        search's, and for a final judgment again where the last timing is older than ``FINAL_BASELINES_FRESH_S``.
        Timed by a worker that never loads candidate code, on the timing sets every candidate is timed on. Needs
        nothing of the reference's job, so the two run at once."""
        key = (problem.key, final)
        with self._lock:
            lock = self._ref_locks.setdefault(f"baselines:{final}:{problem.key}", threading.Lock())
        with lock:
            got = self._baselines_got.get(key)
            if got is not None and (not final or time.monotonic() - got.at < FINAL_BASELINES_FRESH_S):
                return got
            cfg = self.config
            work = tempfile.mkdtemp(dir=self._root, prefix="base-")
            try:
                job = {"kind": "baselines", "device": self.backend.device, "workdir": work,
                       "problem_source": problem.source, "init_seed": self._problem_seed(problem),
                       "specs": [s.__dict__ for s in problem.input_specs],
                       "timing_sets": self._timing_sets(problem),
                       "output_specs": [{"shape": list(o.shape or []), "dtype": o.dtype} for o in problem.output_specs
                                        if o.kind == "tensor"],
                       "l2_bytes": self._l2, "order_seed": int.from_bytes(os.urandom(4), "little"),
                       "timing": {"min_reps": cfg.min_reps, **cfg.protocol(final)},
                       "memory_limit_mb": cfg.memory_limit_mb, "device_memory_fraction": cfg.device_memory_fraction,
                       "flops_dtype": (compute_dtype(problem.dtypes) if problem.op_summary.keys() & COMPUTE_OPS
                                       else None), "tf32": tf32_rate(problem)}
                need = self._need(problem, "baselines", output_bytes(problem.output_specs), len(job["timing_sets"]))
                out = self._run(job, need=need, deadline=deadline)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if out.failure == "deadline":
                raise RuntimeError(DEADLINE_ERROR)
            if out.result is None or not out.result.get("ok"):
                detail = out.detail or (out.result or {}).get("error", "")
                raise RuntimeError(f"the baselines could not be timed ({out.failure or 'error'} in stage "
                                   f"{out.stage}): {detail}")
            got = _Baselines(out.result, time.monotonic())
            for name, why in got.errors.items():
                log.warning("%s: the %s baseline was left out: %s", problem.name, name, why)
            self._baselines_got[key] = got
            return got

    def _unstable_reference(self, path: str | None) -> str | None:
        """Why the reference's second run on trial 0's inputs disagrees with its first, by the judge's own
        tolerance (so atomics' rounding passes), or None."""
        if not path or not os.path.exists(path):
            return None
        from safetensors.torch import load_file

        got = load_file(path)
        os.unlink(path)
        n = sum(1 for k in got if k.startswith("a"))
        _, why = compare_outputs([got[f"a{j}"] for j in range(n)], [got[f"b{j}"] for j in range(n)],
                                 self.config.tolerance, 0, "repeat")
        return why

    def _no_space_message(self, detail: str) -> str:
        free = shutil.disk_usage(self._root).free / 2**30
        return (f"judge resources: the judge's scratch folder {self._root} ran out of disk ({free:.1f} GiB free now) "
                "while writing the outputs of the correctness trials, which it keeps to compare them; set TMPDIR to a "
                "disk with room for (trials + timing sets + judgments in flight) x the problem's output size, or judge "
                f"smaller shapes ({detail})")

    def _absorb_outcome(self, res: EvalResult, out: JobOutcome) -> bool:
        """Fold a worker's death or error into the result; True when there is a result to judge."""
        res.log_tail = out.log_tail[-2000:]
        if out.failure == "deadline":
            res.stage = out.stage
            self._past_deadline(res)
            return False
        if out.failure:
            res.stage = out.stage
            flag = {"timeout": "timeout", "memory_limit": "memory_limit", "crash": "crash"}[out.failure]
            res.error = out.detail
            res.reject(flag, f"{out.detail} (stage {out.stage})")
            return False
        msg = out.result or {}
        if not msg.get("ok") and msg.get("no_space"):
            # Not the candidate's fault: no verdict on it, and an error that says what to change.
            res.stage = out.stage
            res.verdict, res.error = ERROR, self._no_space_message(msg.get("error", ""))
            res.reasons.append(res.error)
            return False
        if not msg.get("ok"):
            res.stage = out.stage
            res.error = msg.get("error", "unknown error")
            flag = "device_error" if msg.get("device_error") else ("out_of_memory" if msg.get("oom") else
                                                                   f"{out.stage}_error")
            res.reject(flag, f"{res.error} (stage {out.stage})")
            res.log_tail = (msg.get("traceback", "") + "\n" + res.log_tail)[-2000:]
            return False
        # The worker's own torch_compute flag could be silenced from inside it; the ops it saw are judged here.
        computed = compute_ops(msg.get("ops_seen") or [])
        if computed and not any(f[0] == "torch_compute" for f in msg.get("flags", [])):
            res.reject("torch_compute", "torch computed during forward: " + ", ".join(computed))
        for flag, reason in msg.get("flags", []):
            if flag in _REJECTING_FLAGS:
                res.reject(flag, reason)
            else:
                res.flags.append(flag)
        return True

    def _judge(self, problem: Problem, source: str, timing: bool | None, final: bool,
               clock: StageClock | None, deadline: float | None, alone: bool = False) -> EvalResult:
        cfg = self.config
        clock = clock or StageClock()
        clock.enter("static")
        res = self._new_result(source, problem.key)
        if self._static(res, source):
            return res
        res.stage = "load"
        want_timing = self.backend.timed if timing is None else timing
        timed = self.backend.timed and want_timing
        try:
            # The reference's and the baselines' jobs (once per problem) are not this candidate's stages.
            clock.enter("reference")
            ref = self._reference(problem, deadline)
        except RuntimeError as e:
            res.verdict, res.error = ERROR, str(e)
            res.reasons.append(str(e))
            return res
        # Timed (or found timed) while the candidate loads, compiles and is checked: the device lock orders the two.
        pending = self._side.submit(self._baselines, problem, final, deadline) if timed else None
        base = self._problem_seed(problem)
        rng = random.Random(int.from_bytes(os.urandom(4), "little"))
        picked = ref.pick_trials(rng)
        with self._workdir("cand-") as work, self._workdir("plan-") as trusted:
            state_file = None
            if ref.state_file:
                # A copy of its own: the candidate's folder is the only one its process may write to.
                state_file = os.path.join(work, "state.safetensors")
                shutil.copyfile(ref.state_file, state_file)
            specs = [s.__dict__ for s in problem.input_specs]
            limits = {"memory_limit_mb": cfg.memory_limit_mb, "device_memory_fraction": cfg.device_memory_fraction}
            sets = len(ref.timing)
            rec_need = ALONE if alone else self._need(problem, "record", ref.out_bytes, sets)
            plan_need = ALONE if alone else self._need(problem, "plan", ref.out_bytes, sets)
            # The candidate's process records its launch plan on inputs of its own; no seed of the judgment's
            # reaches it.
            rec_job = {"kind": "record", "device": self.backend.device, "workdir": work,
                       "problem_source": problem.source, "candidate_source": source, "init_seed": base,
                       "state_file": state_file, "specs": specs, **limits}
            rec = self._run(rec_job, _no_outputs(res), need=rec_need, clock=clock, deadline=deadline)
            if not self._absorb_outcome(res, rec) or (res.verdict == REJECTED and res.reasons):
                return res
            model_bytes = os.path.getsize(ref.state_file) if ref.state_file else 0
            if not self._take_plan(res, work, trusted, model_bytes):
                return res
            plan_stat = self._plan_stat(trusted)
            trials = [(ref.trials[k]["seed"], ref.trials[k]["dist"]) for k in picked]
            job = {
                "kind": "plan", "device": self.backend.device, "workdir": trusted, "problem_source": problem.source,
                "candidate_source": source, "trials": trials, "specs": specs,
                "output_specs": ref.trials[0]["outputs"], "order_seed": rng.getrandbits(32), "timed": timed,
                "timing": {"min_reps": cfg.min_reps, **cfg.protocol(final)},
                "timing_sets": [(t["seed"], t["dist"]) for t in ref.timing], "l2_bytes": self._l2,
                # The interpreter compiles nothing: no cache to share.
                "triton_cache": self.trusted_cache() if self.backend.device != "cpu" else None, **limits,
            }
            if not want_timing and self.backend.timed:
                job["timing"] = None  # on the interpreter the rotation re-check always runs; it costs little
            if ref.note:
                res.notes.append(ref.note)
            streamed = _Streamed(res, ref, trusted, trials, picked, cfg.tolerance, self._compare_device)
            out = self._run(job, streamed, need=plan_need, clock=clock, deadline=deadline)
            clock.enter("verdict")
            if res.verdict == ERROR or (res.verdict == REJECTED and res.reasons):
                # An output was rejected (or could not be compared) and the worker stopped there; what its guards
                # saw until then still counts.
                self._absorb_outcome(res, out)
                res.stage = streamed.stage
                return res
            ok = self._absorb_outcome(res, out)
            if not ok:
                return res
            msg = out.result or {}
            self._note_sandbox((rec.result or {}).get("sandbox"))
            res.launches = msg.get("launches", {})
            res.stage = "correctness"
            missing = sorted(set(range(len(trials))) - streamed.taken["trial"])
            if missing or msg.get("stopped"):
                res.reject("protocol", f"the worker ended without handing over trials {missing}")
                return res
            res.trials = len(trials)
            if res.verdict == REJECTED and res.reasons:
                return res
            if job["timing"] is not None:
                # The timing stage re-checks every timing set after the timed calls, and the graph sets it handed.
                if (len(streamed.taken["post"]) != len(ref.timing) or
                        len(streamed.taken["graph"]) != int(msg.get("graphs") or 0) or
                        len(streamed.taken["timed"]) != int(msg.get("timed_checks") or 0)):
                    res.reject("protocol", "the worker's timing stage did not hand over every output it checks")
                    return res
                res.stage = "timing"
            if self._plan_stat(trusted) != plan_stat:
                res.reject("plan", "the launch plan changed while it was being judged")
                return res
            res.correct, res.verdict = True, ACCEPTED
            res.plan = self._stored_plan(trusted)
            if msg.get("samples") and pending is not None:
                clock.enter("reference")
                try:
                    baselines = pending.result()
                except RuntimeError as e:
                    res.verdict, res.correct, res.error = ERROR, False, str(e)
                    res.reasons.append(str(e))
                    return res
                clock.enter("verdict")
                res.final = final
                self._judge_speed(res, problem, msg, baselines)
            res.stage = "done"
            return res

    @staticmethod
    def trusted_cache() -> str:
        """The Triton cache of the jobs that execute plans: outside the judge's scratch root (which those jobs
        hide from themselves), in kernelsmith's home, written by no candidate's process."""
        from ks_core.settings import Settings

        path = str(Settings.from_env().cache_home() / "judge-triton-cache")
        os.makedirs(path, exist_ok=True)
        return path

    @staticmethod
    def _take_plan(res: EvalResult, work: str, trusted: str, model_bytes: int = 0) -> bool:
        """Copy the plan the candidate's process left in its folder into the trusted job's: regular files only, so
        a link planted there reaches nothing of the judge's, and no larger than a plan and the model's own tensors
        need (``model_bytes``: the reference's weights), so a candidate cannot make the judge copy and load
        gigabytes."""
        from ks_inductor.judge.plan import PLAN_FILE, STATE_FILE
        from ks_inductor.judge.plan_job import PLAN_BYTES, state_bytes_cap

        for name in (PLAN_FILE, STATE_FILE):
            src = os.path.join(work, name)
            if os.path.islink(src) or (os.path.exists(src) and not os.path.isfile(src)):
                res.reject("plan", f"the candidate's process left {name} as something other than a file")
                return False
            if not os.path.exists(src):
                if name == PLAN_FILE:
                    res.reject("plan", "the candidate's process left no launch plan")
                    return False
                continue
            if name == PLAN_FILE and os.path.getsize(src) > PLAN_BYTES:
                res.reject("plan", f"the launch plan is larger than {PLAN_BYTES} bytes")
                return False
            if name == STATE_FILE and os.path.getsize(src) > state_bytes_cap(model_bytes):
                res.reject("plan", f"the plan's tensors take {os.path.getsize(src)} bytes, more than "
                           f"{state_bytes_cap(model_bytes)}: a plan carries the model's own tensors and small "
                           "constants")
                return False
            shutil.copyfile(src, os.path.join(trusted, name), follow_symlinks=False)
        return True

    @staticmethod
    def _plan_stat(trusted: str) -> tuple[tuple[int, int, int] | None, ...]:
        """The plan's files in the trusted job's folder as the file system describes them (size, mtime, inode): the
        same before and after the job that executed them, or the plan that is stored is not the one judged."""
        from ks_inductor.judge.plan import PLAN_FILE, STATE_FILE

        out = []
        for name in (PLAN_FILE, STATE_FILE):
            try:
                st = os.stat(os.path.join(trusted, name), follow_symlinks=False)
                out.append((st.st_size, st.st_mtime_ns, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    @staticmethod
    def _stored_plan(trusted: str) -> str:
        """The plan the trusted side executed for this verdict, for the stored kernel to carry
        (``ks_inductor.judged_plan``): its JSON, with the bytes of any constant the forward made from host data
        under ``payload``. "" where it reads the model's own tensors (a stored kernel takes its weights as inputs)."""
        from ks_inductor.judge.plan import PLAN_FILE, STATE_FILE, Plan, PlanError

        try:
            with open(os.path.join(trusted, PLAN_FILE), encoding="utf-8") as f:
                plan = Plan.from_json(f.read())
        except (OSError, PlanError):
            return ""
        kinds = [st["kind"] for st in plan.storages]
        if "state" in kinds:
            return ""
        data = json.loads(plan.to_json())
        consts = [sid for sid, kind in enumerate(kinds) if kind == "const"]
        if consts:
            from safetensors import safe_open

            try:
                with safe_open(os.path.join(trusted, STATE_FILE), framework="pt") as f:
                    data["payload"] = {f"s{sid}": base64.b64encode(f.get_tensor(f"s{sid}").numpy().tobytes())
                                       .decode() for sid in consts}
            except (OSError, KeyError, ValueError):
                return ""
        return json.dumps(data, sort_keys=True)

    def _note_sandbox(self, summary: str | None) -> None:
        """Say once per judge what the candidates' sandbox holds where it could not be put in place."""
        if summary and not summary.startswith("sandbox enforced") and not self._sandbox_said:
            self._sandbox_said = True
            log.warning("candidate workers run without the Landlock sandbox (%s): the static rules and the process "
                        "boundary remain", summary)

    def _judge_speed(self, res: EvalResult, problem: Problem, msg: dict[str, Any], base: _Baselines) -> None:
        from ks_inductor.judge import timing as T

        cfg = self.config
        # The candidate's samples come from its own process, the baselines' from a trusted one, timed on the same
        # sets with the same loops (flush, refresh and poison before every call).
        cand = msg["samples"]["candidate"]
        samples = {"candidate": cand, **base.samples}
        steady: dict[str, Any] = {}
        if "candidate" in (msg.get("steady_samples") or {}) and base.steady:
            steady = {"candidate": msg["steady_samples"]["candidate"], **base.steady}
        for name, why in base.errors.items():
            res.notes.append(f"the {name} baseline was not timed: {why[:200]}")
        res.timing_meaningful = True
        res.timings = {name: T.summarize(rounds) for name, rounds in samples.items()}
        res.timing_leads = {**base.leads, **(msg.get("leads") or {})}
        behind = {name: int(v.get("behind", 0)) for name, v in res.timing_leads.items() if v.get("behind")}
        if behind:
            res.notes.append("the host was still behind the GPU at the longest spin for "
                             + ", ".join(f"{n} ({k} calls)" for n, k in sorted(behind.items()))
                             + ": those calls' times include the host's")
        lcbs = []
        if "eager" in samples:
            res.speedup_eager, res.speedup_eager_lcb = T.ratio_with_lcb(samples["eager"], cand)
            lcbs.append(res.speedup_eager_lcb)
        if "inductor" in samples:
            res.speedup_inductor, res.speedup_inductor_lcb = T.ratio_with_lcb(samples["inductor"], cand)
            lcbs.append(res.speedup_inductor_lcb)
        for name in sorted(set(samples) - {"candidate", "eager", "inductor"}):
            res.speedup_peers[name], res.speedup_peer_lcbs[name] = T.ratio_with_lcb(samples[name], cand)
            lcbs.append(res.speedup_peer_lcbs[name])
        skipped = msg.get("steady_skipped") or base.steady_skipped
        if skipped:
            res.notes.append(f"steady state not timed: {skipped}; served on the per-call timing alone")
        if "candidate" in steady:
            res.steady_timings = {name: T.summarize(rounds) for name, rounds in steady.items()}
            for name in samples:
                if name != "candidate" and name in steady:
                    res.steady_speedups[name], res.steady_speedup_lcbs[name] = T.ratio_with_lcb(
                        steady[name], steady["candidate"])
        # Served only when faster per call by the margin, and not slower inside a CUDA graph where the deployment
        # runs kernels in one.
        res.in_graphs = cfg.in_graphs
        res.faster = bool(lcbs) and min(lcbs) >= 1 + cfg.margin and not res.graph_slower
        cand_ms = res.timings["candidate"].median_ms
        res.launch_bound = bool(base.launch_ms) and cand_ms <= LAUNCH_BOUND_LAUNCHES * float(base.launch_ms or 0.0)
        res.not_faster = res.speed_why(cfg.margin)
        wall = msg.get("wall")
        if wall:
            hidden = wall["hidden_ms"] - wall["overhead_ms"]
            if hidden > 1.5 * cand_ms + 0.01:
                res.reject("side_stream", f"after each call returns, a device-wide sync still waits {hidden:.4f} ms "
                           f"against {cand_ms:.4f} ms measured by events: work runs outside the timed stream")
                return
        # Reported against the bandwidth measured here (as the anchors are); the plausibility gate uses the
        # larger of measured and datasheet peaks so that it never quarantines an honest kernel.
        measured = self._floor_ms(problem, base, nominal=False)
        if measured:
            res.roofline_floor_ms = measured
            res.roofline_fraction = measured / cand_ms
        floor = self._floor_ms(problem, base, nominal=True)
        # Where the problem has a roofline floor, physics is the gate: a time above the floor is possible, however
        # far a slow baseline is behind it (a fused RMSNorm is 11x faster than the eager reference of seven ops
        # on the H200, and still at 74% of the floor). Without a floor, a speedup beyond
        # max_plausible_speedup over the fastest baseline measured in the same run needs a human.
        best = res.speedup_best
        if not floor and best is not None and best > cfg.max_plausible_speedup:
            res.verdict = QUARANTINED
            res.flags.append("implausible_speedup")
            res.reasons.append(f"{best:.1f}x faster than the best baseline ({res.best_baseline}): held for review")
        steady_ms = res.steady_timings["candidate"].median_ms if res.steady_timings else cand_ms
        fastest_ms = min(cand_ms, steady_ms)
        if floor and fastest_ms < cfg.floor_slack * floor:
            res.verdict = QUARANTINED
            res.flags.append("faster_than_roofline")
            res.reasons.append(f"{fastest_ms:.4f} ms is below the roofline floor {floor:.4f} ms: held for review")

    def _floor_ms(self, problem: Problem, base: _Baselines, nominal: bool) -> float | None:
        """The floor at the rates measured beside the baselines, or (``nominal``) at the larger of those and the
        datasheet's, so that the plausibility gate never quarantines an honest kernel."""
        bw, rate = base.bandwidth, base.flops_rate
        if nominal:
            peaks = self.backend.nominal_peaks(self.fingerprint.device_name)
            bw = max(bw or 0.0, peaks.get("bandwidth", 0.0)) or None
            rate = max(rate or 0.0, peaks.get(compute_dtype(problem.dtypes), 0.0)) or None
        return floor_ms(problem, bw, rate)[0]

    def room(self, problem: Problem, deadline: float | None = None) -> Room:
        """``problem``'s room: its floor against eager's and Inductor's times, from the baselines a search's
        judgments are timed against (timed once per problem; on the interpreter, timed on the host CPU when asked
        here). A baseline or reference that fails leaves its figure out, with a note that says why."""
        room = Room(problem_key=problem.key, bytes_moved=problem.bytes_moved, flops=problem.flops,
                    dtype=compute_dtype(problem.dtypes), device=self.fingerprint.device_name)
        try:
            base = self._baselines(problem, False, deadline)
        except RuntimeError as e:
            room.note = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            return room
        from ks_inductor.judge import timing as T

        for name, rounds in base.samples.items():
            if name in ("eager", "inductor") and rounds:
                setattr(room, f"{name}_ms", T.summarize(rounds).median_ms)
            elif rounds:
                room.peer_ms[name] = T.summarize(rounds).median_ms
        room.bandwidth, room.flops_rate, room.launch_ms = base.bandwidth, base.flops_rate, base.launch_ms
        room.floor_ms, room.bound = floor_ms(problem, base.bandwidth, base.flops_rate, base.launch_ms)
        room.note = "; ".join(f"{k} not timed: {v[:150]}" for k, v in base.errors.items())
        return room

    def submit_room(self, problem: Problem, deadline: float | None = None) -> Future[Room]:
        """:meth:`room` in the background: a warm measures its regions' rooms at once (references in parallel, the
        baselines' timing one region at a time per device)."""
        return self._executor.submit(self.room, problem, deadline)


def evaluate(problem: Problem, source: str, config: JudgeConfig | None = None) -> EvalResult:
    """One-shot evaluation (starts and stops a judge)."""
    with Judge(config, spares=False) as judge:
        return judge.evaluate(problem, source)
