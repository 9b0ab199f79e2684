"""A warm parent for the judge's workers: it imports torch, triton and the worker's modules once, then forks a fresh
child for every job. Inductor's code generation for the seeds forks its throwaway processes the same way
(``ks_inductor/seeds/inductor/generate.py``).

A worker started from nothing spends about 3 s of CPU importing before it runs a job that takes well under one on the
interpreter backend, so on a small CPU box the imports would be most of a judgment. A forked child starts from the
warm parent's memory, which no job has touched: each job still gets a process of its own that dies with it.

The parent never initialises a device: CUDA cannot be used in a child forked after the parent touched it. Importing
torch and triton does not initialise one; each child does, as a process started from scratch would, on the device
the parent's environment selects (one parent per device). A parent that finds a device initialised refuses to fork,
and the judge starts that worker from scratch. The protocol is JSON over a Unix socket; the child's stdin, protocol pipe
and log travel as file descriptors (SCM_RIGHTS), and the parent reports each child's exit status, since the judge is
not the child's parent and cannot wait for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
_MSG_MAX = 65536
# What the parent imports ahead (a ``module:function`` it calls once) and what each child runs with its protocol pipe
# (``module:function(fd)``): the judge's worker by default; Inductor's code generation uses the same machinery.
WORKER_PRELOAD = "ks_inductor.judge.worker:preload_for_fork"
WORKER_ENTRY = "ks_inductor.judge.worker:serve"


class ForkServerError(RuntimeError):
    pass


class ForkedProcess:
    """The handle the judge keeps on a forked worker: the part of ``subprocess.Popen`` the pool uses."""

    def __init__(self, server: ForkServer, pid: int, stdin: BinaryIO) -> None:
        self.server = server
        self.pid = pid
        self.stdin = stdin

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        code = self.server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        """The child and whatever it started: it leads a session of its own (``_child``)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The judge's side: starts the warm parent and asks it for children."""

    def __init__(self, env: dict[str, str], cwd: str, name: str = "forkserver", probe_device: bool = False,
                 wait: bool = True, preload: str = WORKER_PRELOAD, entry: str = WORKER_ENTRY) -> None:
        """Start the parent. ``wait``: until it is ready (its imports and probe done), raising ForkServerError if it
        does not come up; otherwise the first :meth:`fork` waits, and the caller's own start-up overlaps the
        parent's imports. ``preload`` and ``entry``: what the parent imports once and what each child runs
        (``module:function``; the judge's worker by default)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self.log_path = os.path.join(cwd, f"{name}.log")
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ks_inductor.judge.forkserver", str(theirs.fileno()), preload, entry]
                + (["--probe-device"] if probe_device else []),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),), env=env, cwd=cwd, start_new_session=True,
            )
        theirs.close()
        self._exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._request = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.refused = ""  # why the parent did not come up, once known: it is then closed and never restarted
        self._ready = False
        if wait:
            self._await_ready()

    def _await_ready(self) -> None:
        if self._ready:
            return
        if self.refused:
            raise ForkServerError(self.refused)
        first = self._next_reply(START_TIMEOUT_S)
        if first.get("event") != "ready":
            self.refused = first.get("error") or f"the judge's fork server did not start (its output: {self.log_path})"
            self.close()
            raise ForkServerError(self.refused)
        self._ready = True

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self._sock.recv(_MSG_MAX)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                with self._cond:
                    if msg.get("event") == "exit":
                        self._exits[int(msg["pid"])] = int(msg["code"])
                    else:
                        self._replies.append(msg)
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return {}
                self._cond.wait(left)
            return self._replies.pop(0)

    @property
    def alive(self) -> bool:
        return not self._closed and self.proc.poll() is None

    def fork(self, log_fd: int, cwd: str) -> tuple[ForkedProcess, int]:
        """A new worker: its handle, and the read end of its protocol pipe (the caller's to close)."""
        in_r, in_w = os.pipe()
        ev_r, ev_w = os.pipe()
        try:
            with self._request:
                self._await_ready()
                payload = (json.dumps({"cwd": cwd}) + "\n").encode()
                socket.send_fds(self._sock, [payload], [in_r, ev_w, log_fd])
                reply = self._next_reply(30.0)
        except ForkServerError:
            os.close(in_w)
            os.close(ev_r)
            raise
        except OSError as e:
            os.close(in_w)
            os.close(ev_r)
            raise ForkServerError(f"the judge's fork server is gone: {e}") from e
        finally:
            os.close(in_r)
            os.close(ev_w)
        if "pid" not in reply:
            os.close(in_w)
            os.close(ev_r)
            raise ForkServerError(f"the judge's fork server did not fork: {reply.get('error', 'no answer')}")
        return ForkedProcess(self, int(reply["pid"]), os.fdopen(in_w, "wb")), ev_r

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                if self._closed:
                    # The parent is gone, so nobody reports this child; it is either dead or orphaned and killed.
                    return self._exits.get(pid, -signal.SIGKILL)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._exits[pid]

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# The warm parent's side.

def _function(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(sock: socket.socket, fds: list[int], cwd: str, entry: Any) -> None:
    """Runs in the forked child and never returns."""
    code = 3
    try:
        os.setsid()  # a process group of its own, so the judge's killpg reaches whatever it starts
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        in_r, ev_w, log_fd = fds
        os.dup2(in_r, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (in_r, log_fd):
            if fd > 2:
                os.close(fd)
        sys.stdin = os.fdopen(0, "r", closefd=False)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        sys.stderr = os.fdopen(2, "w", closefd=False)
        os.chdir(cwd)
        entry(ev_w)
        code = 0
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.sendall((json.dumps({"event": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
                      + "\n").encode())


def _device_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _child_can_use_device() -> bool:
    """Whether a child forked now initialises the device: the imports above must not have touched the driver."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def serve(fd: int, probe: bool = False, preload: str = WORKER_PRELOAD, entry: str = WORKER_ENTRY) -> None:
    sock = socket.socket(fileno=fd)
    _function(preload)()
    run = _function(entry)
    if probe and not _child_can_use_device():
        sock.sendall(b'{"event": "unusable", "error": "a child forked here cannot initialise the device"}\n')
        os._exit(0)
    sock.sendall(b'{"event": "ready"}\n')
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        _reap(sock)
        if not readable:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, _MSG_MAX, 3)
        if not msg:
            # The judge closed its end. Exit at once: tearing down the interpreter with torch and triton loaded
            # takes about 2 s, which a time-limited run would pay at its end.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            req = json.loads(msg)
            if len(fds) != 3:
                raise ValueError(f"expected 3 descriptors, got {len(fds)}")
            if _device_initialised():
                raise RuntimeError("a device was initialised in the fork server; a forked child could not use it")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(sock, fds, req["cwd"], run)
            reply: dict[str, Any] = {"event": "forked", "pid": pid}
        except Exception as e:  # noqa: BLE001 - a bad request is answered, never fatal to the server
            reply = {"event": "error", "error": f"{type(e).__name__}: {e}"}
        finally:
            for f in fds:
                os.close(f)
        sock.sendall((json.dumps(reply) + "\n").encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]), probe="--probe-device" in sys.argv[4:], preload=sys.argv[2], entry=sys.argv[3])
