"""One device, one measurement at a time, across every kernelsmith process on the host.

Within a process, a :class:`DeviceLock` is a reader-writer lock: jobs compile and check on a device together
("shared") and time on it alone ("exclusive"), writers preferred. Across processes the same lock is an
``fcntl.flock`` on a file that names the physical device: held shared while any holder in the process is shared,
exclusive while one is exclusive, and let go when the last holder releases. Judges, warms, ``pack verify --run``,
Ray workers on one node and the compile backend's graph guard all take it, so one process's timing never sees
another's kernels on its stream. The kernel drops a flock when its process exits, however it exits, so a holder that
dies frees the device.

The lock files live in ``$KERNELSMITH_LOCK_DIR``, else ``/tmp/kernelsmith-locks`` (mode 1777, files 0666, so the
users of one host share them), one per device: the GPU's UUID, which every process sees alike whatever its
``CUDA_VISIBLE_DEVICES``, or ``cpu`` for the interpreter.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterator

from ks_core.settings import VARIABLES, Settings

log = logging.getLogger(__name__)

ENV_LOCK_DIR = VARIABLES["lock_dir"].env
CPU = "cpu"

_SHARED = "shared"
_EXCLUSIVE = "exclusive"


def lock_dir() -> str:
    """Where the lock files are: ``$KERNELSMITH_LOCK_DIR``, else ``/tmp/kernelsmith-locks``."""
    return str(Settings.read("lock_dir"))


def lock_path(name: str, directory: str | None = None) -> str:
    """The lock file of device ``name``."""
    return os.path.join(directory or lock_dir(), re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".lock")


def visible_device(index: int, visible: str | None) -> str:
    """What a worker's ``CUDA_VISIBLE_DEVICES`` says for device ``index`` of a judge whose own is ``visible``: the
    judge's entry for it (an index or a UUID), so that the worker runs on the device the judge numbers ``index``,
    and the two name it alike (``JudgeBackend.device_id``). Without a list, or past its end, the index itself."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries[index] if 0 <= index < len(entries) else str(index)


def _visible_entry(index: int) -> str:
    return visible_device(index, os.environ.get("CUDA_VISIBLE_DEVICES"))


def physical_device_name(index: int | None = None) -> str:
    """The name of this process's CUDA device ``index`` (None: the current device) that every process on the host
    gives it, whatever its ``CUDA_VISIBLE_DEVICES``: ``gpu-<UUID>``, else ``pci-<domain:bus:device>``, else the
    device's entry in ``CUDA_VISIBLE_DEVICES`` (right only while every process enumerates devices alike)."""
    import torch

    i = torch.cuda.current_device() if index is None else index
    try:
        props = torch.cuda.get_device_properties(i)
    except Exception as e:  # noqa: BLE001 - a device torch cannot describe still needs a lock of some name
        log.warning("cannot read the properties of CUDA device %d (%s); its lock is named by its index", i, e)
        return f"cuda-{_visible_entry(i)}"
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid.strip("0-"):
        return f"gpu-{uuid}"
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        return (f"pci-{int(getattr(props, 'pci_domain_id', 0)):04x}:{int(bus):02x}:"
                f"{int(getattr(props, 'pci_device_id', 0)):02x}")
    return f"cuda-{_visible_entry(i)}"


def _make_dir(directory: str) -> None:
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(directory, 0o1777)
    except FileExistsError:
        return
    # The umask narrowed it; every user of the host locks devices here.
    with contextlib.suppress(OSError):
        os.chmod(directory, 0o1777)


def _open_lock_file(name: str) -> int | None:
    """A read-only descriptor of ``name``'s lock file (flock needs no write access, so a file another user made
    serves as well), created where missing; None, with a warning, where it cannot be opened."""
    path = lock_path(name)
    try:
        _make_dir(os.path.dirname(path))
        try:
            # Opened without O_CREAT first: with fs.protected_regular, O_CREAT on another user's file in a sticky
            # directory is refused even though the file exists.
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)
        return fd
    except OSError as e:
        log.warning("cannot open the device lock %s (%s): timing on %s is kept apart from this process's other "
                    "jobs only, not from other kernelsmith processes", path, e, name)
        return None


class DeviceLock:
    """Many jobs may use a device at once to compile and check; timing takes it alone. Writers (timing) are
    preferred so that a stream of new jobs cannot starve a measurement.

    With a ``name`` (:func:`physical_device_name`, or ``"cpu"``) the lock also holds across processes through a
    flock on that device's lock file: the in-process lock is taken first and then the file lock, so the threads of
    one process share one flock instead of competing for it. The flock belongs to this object's own descriptor (a
    flock belongs to the open file description), is taken when the in-process count rises from zero and let go
    when it falls back to zero. A flock cannot be turned from shared into exclusive atomically, and it never is
    here: an exclusive holder in this process waits for the shared ones to leave, and by then the flock is gone.
    Without a name the lock is this process's alone."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0
        self._held: str | None = None  # the flock this lock holds on its file
        self._taking = False  # a holder is taking the flock; the others of its mode wait for it
        self._told = False  # a wait for another process was logged at INFO once; later ones go to DEBUG
        self._fd = _open_lock_file(name) if name else None
        if self._fd is not None:
            weakref.finalize(self, os.close, self._fd)

    @property
    def path(self) -> str | None:
        """The lock file, where there is one."""
        return lock_path(self.name) if self._fd is not None and self.name else None

    def acquire(self, mode: str) -> None:
        with self._cond:
            if mode == _EXCLUSIVE:
                self._waiting += 1
                while self._exclusive or self._shared:
                    self._cond.wait()
                self._waiting -= 1
                self._exclusive = True
            else:
                while self._exclusive or self._waiting:
                    self._cond.wait()
                self._shared += 1
            while self._taking:
                self._cond.wait()
            take = self._fd is not None and self._held is None
            if take:
                self._taking = True
        if not take:
            return
        try:
            self._flock(mode)
        except BaseException:
            with self._cond:
                self._taking = False
                self._leave(mode)
            raise
        with self._cond:
            self._held = mode
            self._taking = False
            self._cond.notify_all()

    def release(self, mode: str) -> None:
        with self._cond:
            self._leave(mode)

    def _leave(self, mode: str) -> None:
        if mode == _EXCLUSIVE:
            self._exclusive = False
        else:
            self._shared -= 1
        if not self._exclusive and not self._shared and self._held is not None:
            assert self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._held = None
        self._cond.notify_all()

    def _flock(self, mode: str) -> None:
        assert self._fd is not None
        op = fcntl.LOCK_EX if mode == _EXCLUSIVE else fcntl.LOCK_SH
        try:
            fcntl.flock(self._fd, op | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        say = log.debug if self._told else log.info
        self._told = True
        if mode == _EXCLUSIVE:
            say("waiting for another kernelsmith process to finish on %s before timing (lock %s)", self.name,
                self.path)
        else:
            say("waiting for another kernelsmith process timing on %s (lock %s)", self.name, self.path)
        fcntl.flock(self._fd, op)


_locks: dict[tuple[str, str], DeviceLock] = {}
_locks_guard = threading.Lock()
_depth = threading.local()


def _forget_in_child() -> None:
    # A forked child shares its parent's open file descriptions, and so its flocks: it opens its own.
    global _locks_guard
    _locks.clear()
    _locks_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _process_lock(name: str) -> DeviceLock:
    key = (lock_dir(), name)
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = DeviceLock(name)
        return lock


@contextlib.contextmanager
def exclusive(device: int | str | None = None) -> Iterator[DeviceLock]:
    """Hold ``device`` alone against every kernelsmith process for a measurement made outside the judge: a CUDA
    device index of this process (None: the current device) or ``"cpu"``. Waits while another process (a judge's
    job, another measurement) uses the device. Re-entrant within a thread; the threads of one process share one
    lock per device."""
    name = device if isinstance(device, str) else physical_device_name(device)
    lock = _process_lock(name)
    held: dict[int, int] = _depth.__dict__.setdefault("held", {})
    key = id(lock)
    if held.get(key):
        held[key] += 1
        try:
            yield lock
        finally:
            held[key] -= 1
        return
    lock.acquire(_EXCLUSIVE)
    held[key] = 1
    try:
        yield lock
    finally:
        held[key] = 0
        lock.release(_EXCLUSIVE)
