"""Worker processes and their supervision: time limits per stage, a memory limit, the per-device timing lock.

Each job gets a fresh process that ends with it: a crash, a hang, a CUDA error or anything a candidate leaves behind
can never reach the next candidate. Spares per device are started ahead, each with its device context made, so
that the torch import and the context (the host makes them one at a time) are off the critical path. The
processes are forked from a warm parent per device that did the imports once and never touched the device
(``forkserver.py``).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ks_core.settings import Settings
from ks_inductor.judge.admission import MemoryGate
from ks_inductor.judge.backends import JudgeBackend, worker_environment
from ks_inductor.judge.clock import STAGE_NAMES, StageClock
from ks_inductor.judge.device_lock import DeviceLock
from ks_inductor.judge.forkserver import ForkedProcess, ForkServer, ForkServerError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 180.0


@dataclass
class JobOutcome:
    """What came back from one worker: its result message, or how it died."""

    result: dict[str, Any] | None
    stage: str
    failure: str | None = None  # timeout | crash | memory_limit | deadline (the caller's limit) | None
    detail: str = ""
    log_tail: str = ""
    stages: list[str] = field(default_factory=list)


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class WorkerProcess:
    def __init__(self, backend: JudgeBackend, device_index: int | None, log_dir: str,
                 forks: ForkServer | None = None) -> None:
        self.device_index = device_index
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"worker-{os.getpid()}-{id(self):x}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        r = None
        if forks is not None and forks.alive:
            try:
                self.proc, r = forks.fork(self._log.fileno(), log_dir)
            except ForkServerError as e:
                log.warning("%s; starting the worker from scratch", e)
        if r is None:
            r, w = os.pipe()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ks_inductor.judge.worker", str(w)],
                stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(w,),
                env=worker_environment(backend, device_index), start_new_session=True, cwd=log_dir,
            )
            os.close(w)
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(r,), daemon=True)
        self._reader.start()
        self.ready = False

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as f:
            for line in f:
                try:
                    self._events.put(json.loads(line))
                except json.JSONDecodeError:
                    self._events.put({"event": "garbage", "line": line[:200]})
        self._events.put(None)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        if self.ready:
            return True
        try:
            msg = self._events.get(timeout=timeout)
        except queue.Empty:
            return False
        self.ready = bool(msg and msg.get("event") == "ready")
        return self.ready

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def run_job(self, job: dict[str, Any], stage_limits: dict[str, float], memory_limit_mb: int,
                device_lock: DeviceLock | None,
                on_output: Callable[[dict[str, Any]], bool] | None = None,
                clock: StageClock | None = None, deadline: float | None = None) -> JobOutcome:
        """Send the job and supervise it to the end. Stage limits apply per stage; waiting for the device lock
        does not count against them, nor does the judge's comparison of an output the worker hands over
        (``on_output``: True lets the worker go on, False stops it). ``clock`` is charged per stage as the
        worker's messages arrive (``StageClock``). Past ``deadline`` (``time.monotonic``) the worker is killed and the
        outcome is a ``deadline`` failure, the caller's limit rather than the candidate's. The process ends with
        its job, however it went."""
        clock = clock or StageClock()
        stages = ["start"]
        clock.enter("worker_start")
        wait = READY_TIMEOUT_S if deadline is None else max(0.0, min(READY_TIMEOUT_S, deadline - time.monotonic()))
        if not self.wait_ready(wait):
            self.kill()
            if deadline is not None and time.monotonic() >= deadline:
                return JobOutcome(None, "start", "deadline", "the caller's time limit ran out", "", stages)
            return JobOutcome(None, "load", "crash", "the worker failed to start", self.log_tail(), stages)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.kill()
            return JobOutcome(None, "load", "crash", "the worker exited before taking the job", self.log_tail(),
                              stages)
        stage = "load"
        stage_until = time.monotonic() + stage_limits.get(stage, 300.0)
        held: list[str] = []
        try:
            while True:
                try:
                    msg = self._events.get(timeout=0.1)
                except queue.Empty:
                    msg = "tick"
                if msg is None:  # the protocol pipe closed: the process is gone
                    code = self.proc.wait(timeout=10)
                    return JobOutcome(None, stage, "crash", _describe_exit(code), self.log_tail(), stages)
                if msg != "tick":
                    ev = msg.get("event")
                    if ev == "stage":
                        stage = msg["stage"]
                        stages.append(stage)
                        label = msg.get("label") or stage
                        clock.enter(label if label in STAGE_NAMES else "other")
                        stage_until = time.monotonic() + stage_limits.get(stage, 300.0)
                    elif ev == "acquire":
                        mode = msg.get("mode", "exclusive")
                        if device_lock is not None:
                            with clock.section("device_wait"):
                                device_lock.acquire(mode)  # waiting for the device is not the candidate's time
                            held.append(mode)
                            clock.granted(mode)
                        self._answer(b"grant\n")
                        stage_until = time.monotonic() + stage_limits.get("timing" if mode == "exclusive" else stage,
                                                                       300.0)
                    elif ev == "release":
                        mode = msg.get("mode", "exclusive")
                        if mode in held and device_lock is not None:
                            held.remove(mode)
                            device_lock.release(mode)
                            clock.released(mode)
                    elif ev == "mark":
                        # Where the time goes within a stage; the stage (and its limit) stays as it was.
                        name = msg.get("name")
                        clock.enter(name if name in STAGE_NAMES else "other")
                    elif ev == "output":
                        with clock.section("compare"):
                            go = on_output(msg) if on_output is not None else False
                        self._answer(b"next\n" if go else b"stop\n")
                        stage_until = time.monotonic() + stage_limits.get(stage, 300.0)
                    elif ev == "result":
                        return JobOutcome(msg, stage, None, "", self.log_tail(), stages)
                if deadline is not None and time.monotonic() > deadline:
                    return JobOutcome(None, stage, "deadline", "the caller's time limit ran out", self.log_tail(),
                                      stages)
                if time.monotonic() > stage_until:
                    return JobOutcome(None, stage, "timeout",
                                      f"exceeded the {stage_limits.get(stage, 300.0):.0f} s limit in stage {stage}",
                                      self.log_tail(), stages)
                if memory_limit_mb and _rss_mb(self.proc.pid) > memory_limit_mb:
                    return JobOutcome(None, stage, "memory_limit",
                                      f"used more than {memory_limit_mb} MB of host memory in stage {stage}",
                                      self.log_tail(), stages)
        finally:
            clock.enter("teardown")
            if device_lock is not None:
                for mode in held:
                    device_lock.release(mode)
            self.kill()

    def _answer(self, line: bytes) -> None:
        """Answer a worker's request. A worker that exited meanwhile (one told to stop can be gone before its last
        request is answered) is seen when its protocol pipe closes, not here."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"the worker was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"the worker exited with code {code} before reporting a result"


def _start_fork_server(backend: JudgeBackend, log_dir: str, device: int | None) -> ForkServer | None:
    """The warm parent for one device's workers (its environment selects that device). It imports torch and triton
    but never initialises a device, so each child forked from it initialises its own, as a fresh process would; a
    parent that finds a device initialised refuses to fork and the workers start from scratch. Off with
    KERNELSMITH_JUDGE_FORK=0; if it cannot start, workers start from scratch."""
    if not Settings.read("judge_fork"):
        return None
    os.makedirs(log_dir, exist_ok=True)
    try:
        # Not waited for: its imports overlap the judge's own start, and the first fork waits for them.
        return ForkServer(worker_environment(backend, device), log_dir,
                          name="forkserver" if device is None else f"forkserver-{device}",
                          probe_device=backend.device != "cpu", wait=False)
    except (ForkServerError, OSError) as e:
        log.warning("%s; workers start from scratch", e)
        return None


class WorkerPool:
    """Hands out fresh, already-started workers per device and keeps one spare warm for each."""

    def __init__(self, backend: JudgeBackend, devices: list[int | None], log_dir: str, spares: int = 1,
                 gate_bytes: int = 0) -> None:
        self.backend = backend
        self.devices = devices
        self.log_dir = log_dir
        self.spares_enabled = spares > 0
        self._spares: dict[int | None, list[WorkerProcess]] = {d: [] for d in devices}
        self._lock = threading.Lock()
        # Held across processes too: every kernelsmith process on the host times on a device one at a time.
        self.device_locks = {d: DeviceLock(backend.device_id(d)) for d in devices}
        # Whole jobs, not stages: admitted by the device memory each holds (admission).
        self.job_gates = {d: MemoryGate(gate_bytes) for d in devices}
        self._next = 0
        self._closed = False
        self.fork_servers = {d: _start_fork_server(backend, log_dir, d) for d in devices}
        self._fork_restarts = {d: 0 for d in devices}
        # Enough warm spares that every job in flight starts on an already-imported worker.
        for d in devices:
            for _ in range(spares):
                self._spares[d].append(WorkerProcess(backend, d, log_dir, self.fork_servers[d]))

    @property
    def forks(self) -> ForkServer | None:
        """The first device's fork server (the only one on the interpreter backend)."""
        return self.fork_servers[self.devices[0]]

    def pick_device(self) -> int | None:
        with self._lock:
            d = self.devices[self._next % len(self.devices)]
            self._next += 1
            return d

    def _revive_forks(self, device: int | None) -> None:
        # A candidate can kill its parent (the fork server) as easily as itself; start another, a few times over.
        forks = self.fork_servers[device]
        if forks is not None and forks.refused:
            self.fork_servers[device] = None  # it never came up here: workers start from scratch, quietly
            return
        if forks is None or forks.alive or self._fork_restarts[device] >= 3 or self._closed:
            return
        self._fork_restarts[device] += 1
        log.warning("the judge's fork server died; starting it again (%d of 3)", self._fork_restarts[device])
        forks.close()
        self.fork_servers[device] = _start_fork_server(self.backend, self.log_dir, device)

    def take(self, device: int | None) -> WorkerProcess:
        """A fresh worker for one job on ``device``: a spare (started now if none is ready), replaced at once."""
        with self._lock:
            self._revive_forks(device)
            forks = self.fork_servers[device]
            ready = [w for w in self._spares[device] if w.proc.poll() is None]
            self._spares[device] = ready
            w = ready.pop(0) if ready else None
            replace = self.spares_enabled and not self._closed
        # Started outside the lock: a start waits on its device's fork server, and the other devices' jobs must not
        # wait behind it.
        if replace:
            spare = WorkerProcess(self.backend, device, self.log_dir, forks)
            with self._lock:
                if self._closed:
                    spare.kill()
                else:
                    self._spares[device].append(spare)
        return w or WorkerProcess(self.backend, device, self.log_dir, forks)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares = [w for ws in self._spares.values() for w in ws]
            for ws in self._spares.values():
                ws.clear()
        for w in spares:
            w.kill()
        for forks in self.fork_servers.values():
            if forks is not None:
                forks.close()
