"""``kernelsmith warm --ray ADDRESS``: the regions' searches spread over a Ray cluster.

:func:`ks_inductor.warm.warm` makes the plan (the keys with no verified kernel yet) and reads every region's outcome;
this module is its second executor. Each region is one Ray task, scheduled one per GPU (``num_gpus=1``), or one per
CPU on a cluster without GPUs. A task runs the same search as a local warm (:func:`ks_inductor.warm.region.evolve_region`)
with the same local :class:`~ks_inductor.judge.Judge` and its sandboxed worker processes: candidate isolation is the
judge's, on every worker. Problems and configs cross processes as JSON, never pickled objects.

Where results go (``results``):

- ``db``: the worker writes to the cache itself (kernels, evaluations, steps, run state), as a local warm does. The
  default when the cache is a server database (PostgreSQL) or the cluster is this host alone (a SQLite file every
  worker opens). A worker that cannot see the SQLite file (another host, no shared filesystem) falls back to ``driver``
  for its region.
- ``driver``: the worker searches against a private SQLite file and returns the winner and the search's steps; the
  driver, the one writer, merges them into the cache (:meth:`KernelStore.merge`). The default for a SQLite cache on a
  cluster of several hosts: SQLite's WAL locking does not work across hosts, even on a shared filesystem.

A worker that dies (killed, out of memory, its node lost) takes no result with it: nothing of a region counts until
its task returns. Ray runs the task again (``max_retries``); when those retries are spent the driver submits it once
more (:data:`RESUBMITS`), so the warm completes. With ``db`` a re-run resumes the search from the run state the dead
worker last committed.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kernel_cache.urls import CacheURL, parse_url
from ks_core.fingerprint import EnvFingerprint
from ks_inductor.contracts import Apply, RegionSource, SearchJudge, SearchStore

if TYPE_CHECKING:
    from ks_core.problem_record import Problem
    from ks_inductor.evolve.config import EvolveConfig

log = logging.getLogger(__name__)

# Ray re-runs a task whose worker process died this many times...
MAX_RETRIES = 2
# ...then the driver submits it again this many times before the region is reported failed.
RESUBMITS = 2
# Environment the workers need from the driver: the interpreter switch and kernelsmith's own settings.
FORWARDED_ENV = ("TRITON_INTERPRET",)
FORWARDED_PREFIX = "KERNELSMITH_"


class RayUnavailable(Exception):
    """Ray is not installed, or the cluster cannot be reached; the message says what to do."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray on this host and every node: pip install 'ray>=2.9'") from None
    return ray


def forwarded_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_PREFIX)}
    env.pop("KERNELSMITH_DB", None)  # the driver passes the cache's URL itself
    return env


def config_from_json(data: dict[str, Any]) -> Any:
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.evolve.config import LLMConfig

    d = dict(data)
    llm = d.pop("llm", None)
    return EvolveConfig(**{k: v for k, v in d.items() if k in EvolveConfig.__dataclass_fields__},
                        llm=LLMConfig(**llm) if llm else None)


# ----------------------------------------------------------------------------------------- on the workers

# One judge per worker process and device set: Ray reuses worker processes across tasks, and a judge's sandboxed
# workers cost seconds to start.
_JUDGES: dict[tuple[str, str], SearchJudge] = {}


def _close_judges() -> None:
    for j in _JUDGES.values():
        try:
            j.close()
        except Exception:  # noqa: BLE001, S110 - exiting anyway
            pass
    _JUDGES.clear()


def _judge_for(config: EvolveConfig) -> SearchJudge:
    from ks_inductor.evolve.evolver import search_judge, search_judge_config

    # Every setting of the judge a run asks for (backend, trials, baselines, peers, whether CUDA graphs decide): a
    # judge made for another run's settings is not reused. Its seed is drawn per judge, so it is left out.
    settings = {k: v for k, v in search_judge_config(config).to_json().items() if k != "seed"}
    ident = (json.dumps(settings, sort_keys=True, default=str), os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    judge = _JUDGES.get(ident)
    if judge is None:
        if not _JUDGES:
            atexit.register(_close_judges)
        _close_judges()  # another device set or backend: this process's old judge is not needed again
        judge = _JUDGES[ident] = search_judge(config)
    return judge


def _worker_info() -> dict[str, Any]:
    import ray

    ctx = ray.get_runtime_context()
    return {"node": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id()[:8], "pid": os.getpid(),
            "gpus": [str(g) for g in ray.get_gpu_ids()]}


def evolve_task(problem_json: str, config_json: str, db_url: str, results: str, deadline: float | None) -> str:
    """One region on a Ray worker → :func:`ks_inductor.warm.region.evolve_region`'s outcome as a JSON string, plus
    ``worker`` (where it ran), ``written`` (whether the worker stored it) and, when it did not, ``kernel``, ``steps``
    and ``problem`` for the driver to store."""
    from kernel_cache.access import open_store
    from ks_core.problem_record import Problem
    from ks_inductor.warm.region import evolve_region, region_config

    t0 = time.time()
    info = _worker_info()
    problem = Problem.from_json(json.loads(problem_json))
    config = config_from_json(json.loads(config_json))
    left = None if deadline is None else deadline - t0
    if left is not None and left <= 0:
        return json.dumps({"status": "not-run", "note": "the whole-run limit was reached", "worker": info,
                           "written": True, "wall_s": 0.0})
    # Searches on a worker print nothing: a progress bar per worker would interleave on the driver's terminal.
    config = region_config(config, left)
    location = parse_url(db_url)
    path = location.sqlite_file
    written = results == "db" and (path is None or path.exists())
    tmp = None if written else tempfile.mkdtemp(prefix="ks-ray-")
    store = open_store(location if written else os.path.join(tmp, "region.db"))
    try:
        judge = _judge_for(config)
        out = evolve_region(problem, config, store, judge, progress=False)
        out["fingerprint"] = judge.fingerprint.to_json()
        if not written and out.get("summary"):
            s = out["summary"]
            out["kernel"] = s.get("best")
            out["steps"] = [st.to_json() for st in store.steps(run_id=s["run_id"])]
            out["problem"] = problem.to_json()
    finally:
        store.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    out.update(worker=info, written=written, wall_s=time.time() - t0)
    return json.dumps(out)


def _fingerprint_task(backend: str | None) -> str:
    from ks_inductor.judge.backends import current_fingerprint

    return json.dumps(current_fingerprint(backend).to_json())


# ----------------------------------------------------------------------------------------- on the driver


@dataclass
class _Node:
    address: str
    slots: int
    done: int = 0
    last: str = ""


@dataclass
class RayExecutor:
    """Runs :func:`warm`'s regions on a Ray cluster. ``address``: ``auto`` (a running cluster), ``local`` (start one
    in this process for the run, ``num_cpus`` CPUs, the host's GPUs) or a cluster address (``host:6379``,
    ``ray://host:10001``). ``results``: ``auto``, ``db`` or ``driver`` (see the module's docstring). ``max_retries``: Ray's re-runs of a
    task whose worker died, before the driver's own re-submissions."""

    address: str = "auto"
    db: str | CacheURL | None = None  # the cache the workers write to with ``results="db"``; read once, here
    results: str = "auto"
    num_cpus: int | None = None
    max_retries: int = MAX_RETRIES
    started: bool = False
    slots: int = 0
    resources: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, _Node] = field(default_factory=dict)
    worker_deaths: int = 0
    # As a RegionExecutor: the searches run on the workers, each with a judge of its own, and the cluster's GPUs
    # are not this host's to show.
    local: ClassVar[bool] = False
    judge: SearchJudge | None = None
    gpu: Any = None

    @property
    def workers(self) -> int:
        """Searches at once: one per GPU of the cluster (per CPU without GPUs), once connected."""
        return self.slots

    def __post_init__(self) -> None:
        self.db = parse_url(self.db)

    @property
    def location(self) -> CacheURL:
        assert isinstance(self.db, CacheURL)
        return self.db

    def connect(self) -> RayExecutor:
        ray = _ray()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                                      "runtime_env": {"env_vars": forwarded_env()}}
            try:
                if self.address == "local":
                    ray.init(num_cpus=self.num_cpus, **kwargs)
                else:
                    ray.init(address=self.address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise RayUnavailable(f"cannot reach the Ray cluster at {self.address!r}: {e}") from None
            self.started = True
        res = ray.cluster_resources()
        self.resources = res
        gpus = int(res.get("GPU", 0))
        # One search per GPU; a CPU-only cluster runs one per CPU (each judgment's sandbox is a process of its own).
        self.slots = gpus or max(1, int(res.get("CPU", 1)))
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            r = n.get("Resources", {})
            slots = int(r.get("GPU", 0)) if gpus else int(r.get("CPU", 0))
            if slots:
                self.nodes[n["NodeID"][:8]] = _Node(n.get("NodeManagerAddress", "?"), slots)
        if self.results == "auto":
            self.results = "db" if self._shared_db() else "driver"
        return self

    def _shared_db(self) -> bool:
        if self.location.sqlite_file is None:
            return True  # a server database: every worker reaches it
        import ray

        here = ray.util.get_node_ip_address()
        return self.address == "local" or all(n.address == here for n in self.nodes.values())

    def close(self) -> None:
        if self.started:
            _ray().shutdown()
            self.started = False

    def _options(self) -> dict[str, Any]:
        if self.resources.get("GPU"):
            return {"num_gpus": 1, "num_cpus": 0}
        return {"num_cpus": 1}

    def fingerprint(self, config: EvolveConfig) -> EnvFingerprint:
        """The workers' environment (what their kernels are stored under), asked of one worker."""
        ray = _ray()
        task = ray.remote(_fingerprint_task).options(**self._options(), max_retries=MAX_RETRIES)
        return EnvFingerprint.from_json(json.loads(ray.get(task.remote(config.backend))))

    def describe(self) -> str:
        kind = "GPU" if self.resources.get("GPU") else "CPU"
        return (f"Ray cluster: {len(self.nodes)} node(s), {self.slots} {kind} worker(s); results written by "
                f"{'the workers to the shared cache' if self.results == 'db' else 'this driver'}")

    def run(self, regions: RegionSource, config: EvolveConfig, store: SearchStore, deadline: float | None,
            apply: Apply, console: Any) -> None:
        """Submit every region ``regions`` hands out (all at once: no room orders them here), then read outcomes
        as they come: ``apply(item, outcome)`` for each. A region whose worker died after Ray's own retries is
        submitted again (:data:`RESUBMITS` times)."""
        ray = _ray()
        task = ray.remote(evolve_task).options(**self._options(), max_retries=self.max_retries)
        config_json = json.dumps(config.to_json())
        console.print(self.describe())
        pending: dict[Any, tuple[Any, Any, int]] = {}

        def submit(item: Any, problem: Problem, resubmits: int) -> None:
            ref = task.remote(json.dumps(problem.to_json()), config_json, self.location.url, self.results, deadline)
            pending[ref] = (item, problem, resubmits)

        for item, problem in iter(regions.take, None):
            submit(item, problem, 0)
        try:
            self._collect(pending, submit, store, config, apply, _Board(self, regions.total, console))
        except BaseException:
            # Interrupted: the searches still queued or running would go on writing for nobody.
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception as e:  # noqa: BLE001 - the cluster may be gone already
                    log.debug("cancelling a search: %s", e)
            raise

    def _collect(self, pending: dict[Any, tuple[Any, Any, int]], submit: Any, store: SearchStore,
                 config: EvolveConfig, apply: Apply, board: _Board) -> None:
        ray = _ray()
        import ray.exceptions as rx

        # The worker, its node or its memory gone: the region itself did nothing wrong, so it runs again.
        lost = tuple(getattr(rx, n) for n in ("WorkerCrashedError", "RayActorError", "NodeDiedError",
                                              "OutOfMemoryError") if hasattr(rx, n))
        with board:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                board.refresh(len(pending))
                for ref in done:
                    item, problem, resubmits = pending.pop(ref)
                    try:
                        outcome = json.loads(ray.get(ref))
                    except lost as e:
                        self.worker_deaths += 1
                        if resubmits < RESUBMITS:
                            log.warning("%s: its worker died (%s); submitting it again", item.name,
                                        type(e).__name__)
                            submit(item, problem, resubmits + 1)
                            continue
                        outcome = {"status": "failed", "note": f"every worker that ran it died: {type(e).__name__}"}
                    except Exception as e:  # noqa: BLE001 - one region failing must not stop the others
                        outcome = {"status": "failed", "note": f"{type(e).__name__}: {e}"[:300]}
                    if not outcome.get("written", True):
                        try:
                            self._store(store, outcome, config.to_json())
                        except Exception as e:  # noqa: BLE001 - the other regions' results still get stored
                            log.warning("storing %s's result failed: %s", item.name, e)
                            outcome = {**outcome, "status": "failed", "note": f"storing it failed: {e}"[:300]}
                    apply(item, outcome)
                    board.finished(item, outcome)
            board.refresh(0)

    @staticmethod
    def _store(store: SearchStore, outcome: dict[str, Any], config: dict[str, Any]) -> None:
        """The one-writer path: a worker's run, winner and steps, stored in the driver's cache under a run of its
        own (the worker's run lived in a private file)."""
        from kernel_cache.record import KernelRecord, StepRecord
        from ks_core.problem_record import Problem
        from ks_inductor.judge.backends import EnvFingerprint

        if outcome.get("problem") is None or outcome.get("fingerprint") is None:
            return
        problem = Problem.from_json(outcome["problem"])
        store.upsert_problem(problem)
        run_id = store.start_run(problem.key, EnvFingerprint.from_json(outcome["fingerprint"]), config)
        kernel = outcome.get("kernel")
        if kernel:
            store.merge([problem], [KernelRecord.from_json({**kernel, "id": None, "run_id": run_id})])
        for st in outcome.get("steps") or []:
            try:
                store.add_step(StepRecord.from_json({**st, "id": None, "run_id": run_id}))
            except Exception as e:  # noqa: BLE001 - a lost trajectory row must not lose the kernel
                log.warning("could not store a step: %s", e)
        store.finish_run(run_id, {**(outcome.get("summary") or {}), "run_id": run_id,
                                  "worker": outcome.get("worker")})


class _Board:
    """Live view of the cluster: per node its workers, regions running and finished, the last outcome."""

    def __init__(self, ex: RayExecutor, total: int, console: Any) -> None:
        self.ex, self.total, self.console = ex, total, console
        self.finished_n = 0
        self.t0 = time.monotonic()
        self.live: Any = None

    def __enter__(self) -> _Board:
        from rich.live import Live

        self.live = Live(self._table(self.total), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.stop()

    def _table(self, pending: int) -> Any:
        from rich.table import Table

        t = Table(title=f"warm on Ray: {self.finished_n}/{self.total} regions, {pending} queued or running, "
                        f"{self.ex.worker_deaths} worker deaths, {time.monotonic() - self.t0:.0f}s", title_justify="left")
        for col in ("node", "workers", "finished", "last"):
            t.add_column(col, overflow="fold")
        for node_id, n in self.ex.nodes.items():
            t.add_row(f"{n.address} ({node_id})", str(n.slots), str(n.done), n.last)
        return t

    def refresh(self, pending: int) -> None:
        self.live.update(self._table(pending))

    def finished(self, item: Any, outcome: dict[str, Any]) -> None:
        self.finished_n += 1
        w = outcome.get("worker") or {}
        node = self.ex.nodes.get(w.get("node_id", ""))
        if node is not None:
            node.done += 1
            node.last = f"{item.name}: {item.status}"
        self.console.print(f"  {item.name} {item.key[:12]}: {item.status} on {w.get('node', '?')} "
                           f"pid {w.get('pid', '?')}{' gpu ' + ','.join(w['gpus']) if w.get('gpus') else ''} "
                           f"({outcome.get('wall_s', 0.0):.0f}s)")
