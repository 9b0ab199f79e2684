"""One device, one measurement at a time across kernelsmith processes (``judge/device_lock.py``).

Real processes hold the interpreter's ``cpu`` lock in a folder of the test's own; each is a small script that takes
and gives back the lock on command and reports when it did (``time.monotonic`` is one clock for the whole host) and
what it logged. CPU only."""

from __future__ import annotations

import logging
import os
import queue
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ks_inductor.judge import device_lock as DL
from ks_inductor.judge.device_lock import DeviceLock

ROOT = Path(__file__).resolve().parent.parent

HOLDER = r"""
import logging, sys, time
from ks_inductor.judge.device_lock import DeviceLock

class Say(logging.Handler):
    def emit(self, record):
        print("log", record.getMessage(), flush=True)

logger = logging.getLogger("ks_inductor.judge.device_lock")
logger.addHandler(Say())
logger.setLevel(logging.DEBUG)
lock = DeviceLock("cpu")
print("ready", flush=True)
for line in sys.stdin:
    verb, mode = line.split()
    if verb == "acquire":
        lock.acquire(mode)
        at = time.monotonic()  # held from here on
    else:
        at = time.monotonic()  # held until here
        lock.release(mode)
    print(verb + "d", mode, at, flush=True)
"""

# How long a process that must wait is watched for not getting the lock; a broken lock lets it in within
# milliseconds.
STILL_WAITING_S = 0.5


class Holder:
    """A process with one ``DeviceLock("cpu")``, driven through its stdin."""

    def __init__(self, lock_dir: Path) -> None:
        env = {**os.environ, DL.ENV_LOCK_DIR: str(lock_dir), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def wait_ready(self) -> None:
        assert self.next(60) == "ready"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def send(self, verb: str, mode: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{verb} {mode}\n")
        self.proc.stdin.flush()

    def next(self, timeout: float = 30) -> str:
        return self.lines.get(timeout=timeout)

    def done(self, verb: str, mode: str, timeout: float = 30) -> float:
        """Wait for ``verb`` (acquire/release) of ``mode`` to complete; when the lock was held from (acquire) or
        until (release)."""
        line = self.next(timeout)
        word, got, at = line.split()
        assert (word, got) == (verb + "d", mode), line
        return float(at)

    def take(self, mode: str) -> float:
        self.send("acquire", mode)
        return self.done("acquire", mode)

    def give(self, mode: str) -> float:
        self.send("release", mode)
        return self.done("release", mode)

    def silent_for(self, seconds: float) -> bool:
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self.lines.put(line)
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "locks"
    monkeypatch.setenv(DL.ENV_LOCK_DIR, str(d))
    return d


@pytest.fixture
def holders(lock_dir: Path) -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        h.close()


def _start(holders: list[Holder], lock_dir: Path, n: int) -> list[Holder]:
    made = [Holder(lock_dir) for _ in range(n)]
    holders.extend(made)
    for h in made:  # started together: each pays its interpreter's start while the others do
        h.wait_ready()
    return made


def test_an_exclusive_holder_keeps_another_process_out_in_both_modes(holders: list[Holder], lock_dir: Path) -> None:
    a, b = _start(holders, lock_dir, 2)
    for mode, said in (("shared", "waiting for another kernelsmith process timing on cpu"),
                       ("exclusive", "waiting for another kernelsmith process to finish on cpu before timing")):
        a.take("exclusive")
        b.send("acquire", mode)
        line = b.next()
        assert line.startswith("log ") and said in line, line
        assert b.silent_for(STILL_WAITING_S), f"{mode} was granted while another process held the device alone"
        released = a.give("exclusive")
        assert b.done("acquire", mode) >= released
        b.give(mode)


def test_shared_holders_of_two_processes_overlap_and_exclude_a_third_s_timing(holders: list[Holder],
                                                                              lock_dir: Path) -> None:
    a, b, c = _start(holders, lock_dir, 3)
    a.take("shared")
    b.send("acquire", "shared")
    assert b.next(5).startswith("acquired shared"), "a second process's shared hold waited for the first"
    c.send("acquire", "exclusive")
    assert c.next().startswith("log waiting for another kernelsmith process")
    a.give("shared")
    assert c.silent_for(STILL_WAITING_S), "timing began while another process still held the device shared"
    last = b.give("shared")
    assert c.done("acquire", "exclusive") >= last


def test_a_holder_killed_with_sigkill_frees_the_device(holders: list[Holder], lock_dir: Path) -> None:
    a, b = _start(holders, lock_dir, 2)
    a.take("exclusive")
    b.send("acquire", "exclusive")
    assert b.next().startswith("log waiting")
    assert b.silent_for(STILL_WAITING_S)
    killed = time.monotonic()
    a.proc.kill()  # SIGKILL: nothing of the holder's own runs; the kernel drops its flock
    assert b.done("acquire", "exclusive", timeout=10) >= killed


def test_a_writer_comes_before_readers_that_ask_after_it(lock_dir: Path) -> None:
    lock = DeviceLock("cpu")
    order: list[str] = []
    go = {n: threading.Event() for n in ("r1", "w", "r2")}

    def hold(name: str) -> None:
        mode = "exclusive" if name == "w" else "shared"
        lock.acquire(mode)
        order.append(name)
        go[name].wait(30)
        order.append(f"-{name}")
        lock.release(mode)

    threads = {n: threading.Thread(target=hold, args=(n,)) for n in go}
    threads["r1"].start()
    _wait_for(lambda: order == ["r1"])
    threads["w"].start()
    _wait_for(lambda: lock._waiting == 1)
    threads["r2"].start()
    time.sleep(STILL_WAITING_S)
    assert order == ["r1"], "a reader got in while a writer waited"
    go["r1"].set()
    _wait_for(lambda: "w" in order)
    time.sleep(0.2)
    assert order == ["r1", "-r1", "w"]
    go["w"].set()
    go["r2"].set()
    for t in threads.values():
        t.join(30)
    assert order == ["r1", "-r1", "w", "-w", "r2", "-r2"]


def test_the_threads_of_one_process_hold_the_device_together(holders: list[Holder], lock_dir: Path) -> None:
    """Readers of one process share its one flock: another process's timing waits for the last of them."""
    lock = DeviceLock("cpu")
    (other,) = _start(holders, lock_dir, 1)
    lock.acquire("shared")
    took = threading.Event()
    second = threading.Thread(target=lambda: (lock.acquire("shared"), took.set()))
    second.start()
    assert took.wait(5), "a second reader of the same process waited for the first"
    other.send("acquire", "exclusive")
    assert other.next().startswith("log waiting")
    lock.release("shared")
    assert other.silent_for(STILL_WAITING_S), "another process timed while a thread of this one held the device"
    last = time.monotonic()
    lock.release("shared")
    assert other.done("acquire", "exclusive") >= last


def test_exclusive_is_reentrant_in_a_thread_and_keeps_other_processes_out(holders: list[Holder],
                                                                          lock_dir: Path) -> None:
    (other,) = _start(holders, lock_dir, 1)
    with DL.exclusive("cpu") as outer, DL.exclusive("cpu") as inner:
        assert outer is inner
        other.send("acquire", "shared")
        assert other.next().startswith("log waiting for another kernelsmith process timing on cpu")
        assert other.silent_for(STILL_WAITING_S)
    other.done("acquire", "shared")


def test_lock_files_are_shared_by_the_host_s_users(lock_dir: Path) -> None:
    lock = DeviceLock("gpu-1234abcd/../x")
    assert lock.path is not None and Path(lock.path).parent == lock_dir
    assert Path(lock.path).name == "gpu-1234abcd_.._x.lock"  # no separators from a device's name
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777
    assert stat.S_IMODE(Path(lock.path).stat().st_mode) == 0o666
    lock.acquire("exclusive")
    lock.release("exclusive")


def test_an_unusable_lock_folder_leaves_the_lock_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(DL.ENV_LOCK_DIR, str(blocker / "locks"))
    with caplog.at_level(logging.WARNING, logger=DL.__name__):
        lock = DeviceLock("cpu")
    assert lock.path is None and "cannot open the device lock" in caplog.text
    lock.acquire("shared")
    lock.release("shared")


def test_devices_are_named_alike_whatever_a_process_s_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from ks_inductor.judge.backends import backend_for, worker_environment
    from ks_inductor.judge.device_lock import visible_device

    assert backend_for("triton-interpret").device_id(None) == "cpu"
    cuda = backend_for("triton-cuda")
    props = {0: SimpleNamespace(uuid="6c1f0a2e-0000-4b3c-9d1e-2f3a4b5c6d7e"),
             1: SimpleNamespace(uuid="", pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    assert cuda.device_id(0) == "gpu-6c1f0a2e-0000-4b3c-9d1e-2f3a4b5c6d7e"
    assert cuda.device_id(1) == "pci-0000:3b:00"

    def broken(i: int) -> None:
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert cuda.device_id(1) == "cuda-3"

    # A worker runs on the device its judge numbers d, so the judge's name for d is the worker's device.
    assert worker_environment(cuda, 1)["CUDA_VISIBLE_DEVICES"] == "3"
    assert visible_device(0, "GPU-aa,GPU-bb") == "GPU-aa" and visible_device(1, "GPU-aa, GPU-bb") == "GPU-bb"
    assert visible_device(2, None) == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1f")
    maca = worker_environment(backend_for("triton-maca"), 0)
    assert maca["CUDA_VISIBLE_DEVICES"] == maca["MACA_VISIBLE_DEVICES"] == "MIG-1f"


@pytest.fixture
def lock_judge(lock_dir: Path) -> Iterator[object]:
    from ks_inductor.judge import Judge, JudgeConfig

    with Judge(JudgeConfig(backend="triton-interpret", trials=1), spares=False) as j:
        yield j


@pytest.mark.slow
def test_a_judge_waits_while_another_process_times_on_its_device(lock_judge, holders: list[Holder],
                                                                  lock_dir: Path) -> None:
    """The judge's workers take the device lock of every kernelsmith process: none of its jobs runs on the device
    while another process times there."""
    from ks_inductor.problem_tracing import load_problem
    from tests.conftest import CANDIDATES, PROBLEMS

    waits: list[float] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for another kernelsmith process" in record.getMessage():
                waits.append(time.monotonic())

    seen = Seen(logging.INFO)
    logger = logging.getLogger(DL.__name__)
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    try:
        (other,) = _start(holders, lock_dir, 1)
        other.take("exclusive")
        problem = load_problem(PROBLEMS / "rmsnorm.py")
        fut = lock_judge.submit(problem, (CANDIDATES / "rmsnorm_ok.py").read_text())
        _wait_for(lambda: bool(waits), timeout=120)
        time.sleep(STILL_WAITING_S)
        assert not fut.done()
        released = other.give("exclusive")
        res = fut.result(timeout=300)
        done = time.monotonic()
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert res.accepted, res.feedback_text()
    assert waits[0] < released < done


def _wait_for(cond, timeout: float = 30) -> None:  # noqa: ANN001
    until = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < until, "timed out"
        time.sleep(0.01)
