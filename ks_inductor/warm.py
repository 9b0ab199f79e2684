"""Cache warming: find the regions a model (or a problem folder, or the recorded misses) needs, and evolve a
verified kernel for each distinct key before the model is compiled.

The regions come from the backend's own analysis (:func:`ks_inductor.explain.explain`), so the keys warmed are
exactly the keys the backend looks up. Warming is resumable: a key that already has a verified kernel for this
machine is skipped (``force`` re-runs it), and the optimizer resumes an unfinished run of a key by itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class WarmError(Exception):
    """Bad warm-up input (a factory that cannot be imported, a missing config); the message says what to fix."""


@dataclass
class WarmItem:
    key: str
    name: str
    origin: str
    signature: str
    status: str = "pending"  # skipped | found | no-kernel | not-run (out of time) | failed
    judged: int = 0
    accepted: int = 0
    best_speedup: float | None = None
    timed: bool = True
    wall_s: float = 0.0
    note: str = ""
    worker: str = ""  # where the search ran, when not here (a Ray worker: node and pid)


@dataclass
class WarmSummary:
    items: list[WarmItem] = field(default_factory=list)
    wall_s: float = 0.0
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # Per local GPU over the searches: mean and max utilisation in percent and the samples taken
    # (ks_inductor.gpu_util.GpuSampler.summary); empty on a CPU, with Ray, or with nothing to evolve.
    gpu_util: list[dict[str, Any]] = field(default_factory=list)
    gpu_util_source: str | None = None

    @property
    def found(self) -> int:
        return sum(i.status in ("found", "skipped") for i in self.items)

    def to_json(self) -> dict[str, Any]:
        return {"items": [asdict(i) for i in self.items], "wall_s": self.wall_s, "fingerprint": self.fingerprint,
                "found": self.found, "judged": sum(i.judged for i in self.items), "gpu_util": self.gpu_util,
                "gpu_util_source": self.gpu_util_source}

    def table(self) -> Any:
        from rich.table import Table

        t = Table(title=f"kernelsmith warm: {self.found}/{len(self.items)} keys have a verified kernel "
                        f"({self.wall_s:.0f}s)", caption=self.gpu_text() or None)
        for col in ("key", "region", "inputs", "status", "judged", "accepted", "best speedup", "s"):
            t.add_column(col, overflow="fold")
        colour = {"found": "green", "skipped": "cyan", "no-kernel": "yellow", "not-run": "yellow", "failed": "red"}
        for i in self.items:
            sp = "-" if i.best_speedup is None else f"{i.best_speedup:.2f}x"
            if i.status in ("found", "skipped") and not i.timed:
                sp = "untimed"
            t.add_row(i.key[:16], i.name, i.signature, f"[{colour.get(i.status, 'white')}]{i.status}[/]",
                      str(i.judged), str(i.accepted), sp, f"{i.wall_s:.0f}")
        return t

    def gpu_text(self) -> str:
        if not self.gpu_util:
            return ""
        return "average GPU utilisation: " + ", ".join(f"GPU {g['gpu']} {g['mean']:.0f}%" for g in self.gpu_util)


# ----------------------------------------------------------------------------------------- sources


def load_factory(spec: str) -> tuple[Any, tuple]:
    """``module:function``, ``path/to/file.py:function`` or a KernelBench file ``path/to/problem.py`` (its
    ``Model(*get_init_inputs())`` and ``get_inputs()``, on the GPU where there is one) → (model, example inputs)."""
    if ":" not in spec and spec.endswith(".py"):
        return kernelbench_model(spec)
    if ":" not in spec:
        raise WarmError(f"{spec!r}: expected module:function, path/to/file.py:function or a KernelBench file")
    target, func_name = spec.rsplit(":", 1)
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target)
            if not path.is_file():
                raise WarmError(f"factory file not found: {path}")
            mod_name = f"ks_factory_{path.stem}"
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise WarmError(f"cannot import {path}")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except WarmError:
        raise
    except Exception as e:  # noqa: BLE001 - user code
        raise WarmError(f"importing {target} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise WarmError(f"{target} has no callable {func_name!r}")
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - user code; its message is what the user needs
        raise WarmError(f"{spec} raised {type(e).__name__}: {e}") from None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise WarmError(f"{spec} must return (model, example_inputs); got {type(out).__name__}")
    model, inputs = out
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs)


def kernelbench_model(path: str | Path, device: str | None = None) -> tuple[Any, tuple]:
    """A KernelBench file as the model a user would compile: ``Model(*get_init_inputs())`` on ``device`` (the GPU
    where there is one), with ``get_inputs()`` there too, both made under seed 0."""
    import torch

    from ks_inductor.problem import ProblemError, exec_problem_source

    p = Path(path)
    if not p.is_file():
        raise WarmError(f"KernelBench file not found: {p}")
    try:
        mod = exec_problem_source(p.read_text(), str(p))
    except ProblemError as e:
        raise WarmError(str(e)) from None
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(dev)
        inputs = tuple(x.to(dev) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs())
    except Exception as e:  # noqa: BLE001 - user code
        raise WarmError(f"{p}: building Model or its inputs failed: {type(e).__name__}: {e}") from None
    return model, inputs


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` strings → dict, values parsed as JSON where they parse (``hidden_size=64``)."""
    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise WarmError(f"override {p!r}: expected key=value")
        k, v = p.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def hf_model(config: str, overrides: dict[str, Any] | None = None, batch: int = 1, seq: int = 16,
             dtype: str | None = None, device: str | None = None) -> tuple[Any, tuple]:
    """A transformers causal LM with random weights from a config file or a model type (nothing downloaded)."""
    try:
        import transformers
    except ImportError:
        raise WarmError("warming from a Hugging Face config needs `transformers` (pip install transformers)") from None
    import torch

    path = Path(config)
    try:
        if path.is_file():
            cfg = transformers.AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json"
                                                          else str(path), **(overrides or {}))
        else:
            cfg = transformers.AutoConfig.for_model(config, **(overrides or {}))
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"cannot build a transformers config from {config!r}: {e}") from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _torch_dtype(dtype) if dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"transformers cannot build a causal LM for {config!r}: {e}") from None
    model = model.to(device=device, dtype=torch_dtype).eval()
    ids = torch.randint(0, int(getattr(cfg, "vocab_size", 1000)), (batch, seq), device=device)
    return model, (ids,)


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def _torch_dtype(name: str) -> Any:
    """``bf16``, ``bfloat16``, ``torch.bfloat16``, ... → the torch dtype; a name torch has no dtype for is a
    WarmError."""
    import torch

    key = name.strip().lower().removeprefix("torch.")
    dtype = getattr(torch, _DTYPE_ALIASES.get(key, key), None)
    if not isinstance(dtype, torch.dtype):
        raise WarmError(f"unknown dtype {name!r}: use bf16, fp16, fp32 or a torch dtype name such as bfloat16")
    return dtype


def problems_from_model(model: Any, inputs: Sequence[Any], db: str | None = None,
                        judge_backend: str | None = None) -> list[Any]:
    from ks_inductor.explain import explain

    return explain(model, *inputs, db=db, judge_backend=judge_backend).problems


def problems_from_folder(folder: str | Path, db: str | None = None, judge_backend: str | None = None) -> list[Any]:
    """The regions of every KernelBench file's model in ``folder``: what ``torch.compile(backend="kernelsmith")``
    of those models looks up (the whole file is a different key from the regions a compile cuts)."""
    from ks_inductor.problem import ProblemError

    root = Path(folder)
    if not root.is_dir():
        raise WarmError(f"KernelBench folder not found: {root}")
    problems = []
    for f in sorted(root.rglob("*.py")):
        if f.name.startswith("_"):
            continue
        try:
            model, inputs = kernelbench_model(f)
            problems.extend(problems_from_model(model, inputs, db=db, judge_backend=judge_backend))
        except (WarmError, ProblemError) as e:
            log.warning("skipping %s: %s", f, e)
    if not problems:
        raise WarmError(f"no KernelBench problem files in {root}")
    return problems


def problems_from_misses(store: Any) -> list[Any]:
    from ks_inductor.problem import Problem

    out = []
    for m in store.misses():
        data = m.get("problem")
        if data:
            out.append(Problem.from_json(data))
    return out


# ----------------------------------------------------------------------------------------- warming


def warm(problems: Sequence[Any], store: Any, config: Any = None, judge: Any = None, force: bool = False,
         console: Any = None, origin: str = "model", total_time_s: float | None = None,
         executor: Any = None) -> WarmSummary:
    """Evolve a kernel for each distinct problem key that has none yet for this machine.

    ``config.time_limit_s`` bounds each key's search; ``total_time_s`` bounds the whole run: each key gets at most
    what is left of it, and keys not reached in time are reported ``not-run``.

    One plan, two executors: the keys that need a search are found here (lookups only), then either searched here
    one after another with the local judge (``executor`` None), or handed to ``executor`` (a
    :class:`ks_inductor.warm_ray.RayExecutor`: one search per Ray worker, each with a local judge of its own).
    Every region's outcome comes back as :func:`evolve_region`'s JSON and is read the same way in both cases."""
    from rich.console import Console

    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.evolver import search_judge
    from ks_inductor.judge.backends import current_fingerprint

    console = console or Console(stderr=True)
    config = config or EvolveConfig()
    own_judge = judge is None
    # The judge (and its worker processes) starts only when a key actually needs evolving: re-warming a warm
    # cache is lookups only. On a cluster the kernels are for the workers' hardware, not the driver's.
    if judge is not None:
        fp = judge.fingerprint
    elif executor is not None:
        fp = executor.fingerprint(config)
    else:
        fp = current_fingerprint(config.backend)
    t0 = time.perf_counter()
    summary = WarmSummary(fingerprint=fp.to_json())
    distinct: dict[str, Any] = {}
    for p in problems:
        distinct.setdefault(p.key, p)
    todo: list[tuple[WarmItem, Any]] = []
    for n, (key, problem) in enumerate(distinct.items(), 1):
        item = WarmItem(key=key, name=problem.name, origin=origin, signature=problem.signature())
        summary.items.append(item)
        existing = store.lookup(key, fp)
        if existing is not None and not force:
            item.status, item.best_speedup, item.timed = "skipped", existing.speedup_inductor, existing.timed
            item.note = f"kernel {existing.id} already verified"
            console.print(f"[{n}/{len(distinct)}] {problem.name} {key[:12]}: [cyan]cached[/] (kernel {existing.id})")
            continue
        todo.append((item, problem))
    if executor is None and len(todo) > 1:
        # Several regions at once, one judge for all: see ks_inductor.warm_parallel.
        from ks_inductor.warm_parallel import RegionThreads, default_parallel_regions

        n = getattr(config, "parallel_regions", None) or default_parallel_regions(fp, judge)
        if n > 1:
            executor = RegionThreads(judge, n)
    gpu = _gpu_sampler(fp, executor, todo)
    if executor is not None:
        if gpu is not None and hasattr(executor, "gpu"):
            executor.gpu = gpu
        try:
            deadline = None if total_time_s is None else time.time() + total_time_s - (time.perf_counter() - t0)
            executor.run(todo, config, store, deadline,
                         lambda item, outcome: apply_outcome(item, outcome, store, fp, console), console)
        finally:
            summary.wall_s = time.perf_counter() - t0
            _end_gpu_sampler(gpu, summary)
        return summary
    try:
        for item, problem in todo:
            left = None if total_time_s is None else total_time_s - (time.perf_counter() - t0)
            if left is not None and left <= 0:
                item.status, item.note = "not-run", f"the whole-run limit of {total_time_s:g} s was reached"
                continue
            n = summary.items.index(item) + 1
            console.print(f"[{n}/{len(distinct)}] {problem.name} {item.key[:12]} ({item.signature}): evolving")
            t1 = time.perf_counter()
            try:
                if judge is None:
                    judge = search_judge(config)
                    # The judge's start is part of the run: the region gets what is left after it.
                    left = None if total_time_s is None else total_time_s - (time.perf_counter() - t0)
                outcome = evolve_region(problem, region_config(config, left), store, judge, progress=True)
            except KeyboardInterrupt:
                item.status, item.note = "failed", "interrupted"
                raise
            apply_outcome(item, outcome, store, fp, console)
            item.wall_s = time.perf_counter() - t1
    finally:
        summary.wall_s = time.perf_counter() - t0
        _end_gpu_sampler(gpu, summary)
        if gpu is not None and summary.gpu_util:
            console.print(summary.gpu_text())
        if own_judge and judge is not None:
            judge.close()
    return summary


def _gpu_sampler(fp: Any, executor: Any, todo: list[Any]) -> Any:
    """A started :class:`ks_inductor.gpu_util.GpuSampler` for a search on this host's GPUs, else None: nothing to
    evolve, an untimed backend (no GPU work worth showing), or a Ray cluster (its GPUs are not all here)."""
    if not todo or not getattr(fp, "timed", False):
        return None
    from ks_inductor.warm_parallel import RegionThreads

    if executor is not None and not isinstance(executor, RegionThreads):
        return None
    from ks_inductor.gpu_util import GpuSampler

    gpu = GpuSampler()
    return gpu.start() if gpu.available else None


def _end_gpu_sampler(gpu: Any, summary: WarmSummary) -> None:
    if gpu is None:
        return
    gpu.stop()
    summary.gpu_util, summary.gpu_util_source = gpu.summary(), gpu.source


def region_config(config: Any, left: float | None) -> Any:
    """``config`` with its per-region time limit cut to ``left`` seconds (what remains of the whole run)."""
    from dataclasses import replace

    if left is not None and (config.time_limit_s is None or config.time_limit_s > left):
        return replace(config, time_limit_s=left)
    return config


def evolve_region(problem: Any, config: Any, store: Any, judge: Any, progress: bool = False) -> dict[str, Any]:
    """One region's search, as JSON: ``status`` (``done``, ``no-kernel`` or ``failed``), ``note`` and, when the
    search ran, ``summary`` (:meth:`EvolveSummary.to_json`). What both executors run, here or on a Ray worker."""
    from ks_inductor.evolve import EvolveError, evolve_problem

    try:
        res = evolve_problem(problem, config, store, judge=judge, progress=progress)
    except EvolveError as e:  # expected: no template covers it and no LLM is configured
        return {"status": "no-kernel", "note": str(e)[:300]}
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one problem failing must not stop the others
        log.warning("warming %s failed: %s", problem.key, e, exc_info=log.isEnabledFor(logging.DEBUG))
        return {"status": "failed", "note": f"{type(e).__name__}: {e}"[:300]}
    return {"status": "done", "note": getattr(res, "note", ""), "summary": res.to_json()}


def apply_outcome(item: WarmItem, outcome: dict[str, Any], store: Any, fp: Any, console: Any = None) -> None:
    """Read one region's outcome (:func:`evolve_region`'s JSON) into ``item``; a stored verified kernel makes it
    ``found`` and clears the key's recorded miss."""
    status = outcome.get("status", "failed")
    item.note = outcome.get("note", "")
    if outcome.get("wall_s") is not None:
        item.wall_s = float(outcome["wall_s"])
    w = outcome.get("worker")
    if w:
        item.worker = f"{w.get('node', '?')} pid {w.get('pid', '?')}"
    if status != "done":
        item.status = status
        if status == "no-kernel" and console is not None:
            console.print(f"  [yellow]no kernel[/]: {item.note}")
        return
    res = outcome.get("summary") or {}
    item.judged, item.accepted = int(res.get("judged", 0)), int(res.get("accepted", 0))
    best = store.lookup(item.key, fp)
    if best is not None:
        item.status, item.best_speedup, item.timed = "found", best.speedup_inductor, best.timed
        _clear_miss(store, item.key)
    else:
        item.status = "no-kernel"


def _clear_miss(store: Any, key: str) -> None:
    try:
        store.clear_miss(key)
    except Exception as e:  # noqa: BLE001 - bookkeeping only
        log.debug("clear_miss(%s): %s", key, e)
