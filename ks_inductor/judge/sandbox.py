"""An operating-system sandbox for the process that runs a candidate's code (Linux Landlock).

``confine(workdir, hidden)`` restricts the calling process for good, and every process and thread it starts later:

- the whole filesystem stays readable and executable, except the ``hidden`` trees (the judge's scratch folder, with
  the reference's outputs and the other jobs' folders): nothing in them can be opened or listed, whatever path,
  symbolic link or bind mount leads there;
- inside them only ``workdir`` (the job's folder) is readable and writable;
- writes anywhere else are refused, except in ``writable`` (Triton's cache, CUDA's JIT cache: ``candidate_writable``),
  in ``/dev`` (CUDA drives the GPU through ``/dev/nvidia*``: character devices stay readable, writable and open to
  ioctls) and in ``/proc/<pid>/task``, the process's own threads, which the CUDA driver writes to as it starts.
  Block devices and the character devices that reach raw storage or memory are not granted, so a worker running as
  root cannot read the scratch folder off the disk;
- where the kernel's Landlock ABI is 4 or later, TCP bind and connect are refused (a candidate needs no network);
  from ABI 6, signals to processes outside the sandbox (the judge, other workers) and connections to abstract Unix
  sockets made outside it are refused too;
- the process's capabilities are dropped (bounding, ambient, effective, permitted, inheritable) and
  ``PR_SET_NO_NEW_PRIVS`` is set, so a worker running as root cannot load kernel code or regain privileges by
  running a program;
- ``TMPDIR`` points into ``workdir``: Triton writes its PTX, its ptxas log and the launcher it builds with the C
  compiler under the temporary folder, and ``/tmp`` itself is no longer writable.

Landlock grants by allow-list and a grant covers a whole tree, so "everything but the hidden trees" is built as:
at each ancestor of a hidden root, every entry not on the way to it is granted (folders as trees, files one by one);
the ancestors themselves get no right, so ``/`` and the folder holding the scratch root cannot be listed either.
Where a hidden root is mounted a second time (a bind mount), that path is hidden as well.

What does not hold everywhere:

- ``landlock_restrict_self`` confines the calling thread and whatever it starts afterwards. Threads the process
  already has (CUDA's and OpenMP's own, a Python thread) keep their access unless the kernel's ABI is 8 or later,
  where ``LANDLOCK_RESTRICT_SELF_TSYNC`` confines all of them at once, and keep their capabilities in any case.
  ``SandboxReport.threads_left`` counts them; call ``confine`` from the thread that will run the candidate's code,
  before that code is loaded.
- Where Landlock is unavailable (a kernel older than 5.13 or built without it, Landlock disabled at boot, a seccomp
  filter refusing its system calls, a user-space kernel without it, any other OS), ``confine`` restricts nothing,
  says why in ``SandboxReport.reason``, and the caller logs it. What then stands between a candidate and the judge's
  files is the static rules (no file, OS, network or interpreter access in the candidate's source) and the process
  boundary (the candidate's process holds no handle on the judge's memory or the reference's outputs other than the
  job's own folder); the judge's scratch root is mode 0700, which keeps other users out, not the worker's own user.
- A Landlock domain can only narrow. A process confined to one job's folder cannot open the next job's folder, so
  a worker that takes several jobs must keep them all in the folder it was confined to.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self. Every architecture on the unified system call
# table numbers them alike (x86-64's own table included); a machine not listed here is reported, never guessed.
_SYSCALLS = {arch: (444, 445, 446) for arch in (
    "x86_64", "amd64", "aarch64", "arm64", "riscv64", "ppc64le", "ppc64", "s390x", "loongarch64",
    "i386", "i686", "armv7l", "armv8l")}

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RESTRICT_SELF_TSYNC = 1 << 3  # ABI 8

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

# The rights a rule on a file (not a folder) may carry; any other bit makes landlock_add_rule fail.
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
_DEVICE = _READ | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV

# /dev entries left out of the grant: raw disks, memory and ports, firmware and hardware-watchdog interfaces. A root
# worker opens a root-owned device however its mode reads, so these would hand it the scratch folder's blocks.
_DEV_WITHHELD_PREFIXES = ("mem", "kmem", "port", "sg", "ng", "nvme", "bsg", "mtd", "watchdog", "mapper", "block",
                          "disk", "cpu", "vfio", "kmsg", "hpet", "snapshot", "loop", "ublk", "vhost")
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass
class SandboxReport:
    """What ``confine`` put in place, or why it put nothing."""

    enforced: bool = False
    reason: str = ""  # why nothing was enforced; empty when it was
    abi: int = 0  # the kernel's Landlock ABI version, 0 where there is none
    network_denied: bool = False  # TCP bind and connect refused (ABI >= 4)
    scoped: bool = False  # signals and abstract Unix sockets outside the sandbox refused (ABI >= 6)
    all_threads: bool = False  # every thread of the process confined at once (ABI >= 8)
    threads_left: int = 0  # threads that already ran and keep their access
    capabilities_dropped: bool = False
    rules: int = 0
    hidden: list[str] = field(default_factory=list)  # the trees hidden, bind-mount aliases included
    skipped: list[str] = field(default_factory=list)  # entries that could not be granted (gone, unreadable)
    elapsed_ms: float = 0.0

    def summary(self) -> str:
        if not self.enforced:
            return f"sandbox not enforced: {self.reason}"
        parts = [f"Landlock ABI {self.abi}, {self.rules} rules", f"hidden {', '.join(self.hidden)}"]
        if self.network_denied:
            parts.append("TCP refused")
        if self.scoped:
            parts.append("signals and abstract sockets scoped")
        if not self.all_threads and self.threads_left:
            parts.append(f"{self.threads_left} earlier thread(s) unconfined")
        if self.capabilities_dropped:
            parts.append("capabilities dropped")
        if self.skipped:
            parts.append(f"{len(self.skipped)} entries not granted")
        return f"sandbox enforced ({'; '.join(parts)}) in {self.elapsed_ms:.1f} ms"


def candidate_writable() -> list[str]:
    """Where a candidate's process writes outside its job folder: Triton's cache (its compiled kernels and the
    launcher it builds per signature) and the CUDA driver's JIT cache. Torch's and Inductor's caches are not needed:
    a candidate only allocates with torch."""
    paths = [_triton_cache_dir()]
    if os.environ.get("CUDA_CACHE_DISABLE") != "1":
        paths.append(os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache"))
    return paths


def _triton_cache_dir() -> str:
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    cache = getattr(knobs, "cache", None)
    if cache is not None and getattr(cache, "dir", None):
        return str(cache.dir)
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (what ``confine`` can enforce here)."""
    sys_ = _Syscalls.load()
    if isinstance(sys_, str):
        return 0
    abi = sys_.abi()
    return abi if isinstance(abi, int) else 0


def confine_job(workdir: str, shared_memory: bool = True, triton_cache: str | None = None) -> SandboxReport:
    """``confine`` as the judge's worker uses it: the job's folder open, the judge's scratch root (the folder that
    holds it) hidden, CUDA's JIT cache writable. Triton's cache moves into the job's folder first: a cache shared
    with other processes is one a candidate could plant compiled kernels in, for a later candidate, or for the
    Triton kernels of the baselines. Without ``shared_memory``, ``/dev/shm`` is read-only: a file left there
    outlives the job, and a candidate's process needs none. ``triton_cache`` names the trusted side's own Triton
    cache, shared by the jobs that execute plans and out of every candidate's reach (``plan_job``)."""
    work = os.path.realpath(workdir)
    cache = triton_cache or os.path.join(work, "triton-cache")
    os.makedirs(cache, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = cache
    return confine(work, [os.path.dirname(work)], candidate_writable(), shared_memory=shared_memory)


def confine(workdir: str, hidden: Sequence[str], writable: Sequence[str] | None = None, *,
            set_tmpdir: bool = True, drop_capabilities: bool = True, shared_memory: bool = True) -> SandboxReport:
    """Confine the calling process for good (see the module's docstring). ``hidden`` trees cannot be read, listed
    or written, except ``workdir`` inside them; writes go only to ``workdir``, ``writable`` (created when missing;
    ``candidate_writable()`` when None) and ``/dev``. Returns what was enforced, or why nothing was; raises
    ValueError only for arguments that make no sense (a missing folder, a hidden ``/``)."""
    start = time.perf_counter()
    work = os.path.realpath(workdir)
    if not os.path.isdir(work):
        raise ValueError(f"workdir {workdir!r} is not a folder")
    roots = sorted({os.path.realpath(h) for h in hidden})
    for h in roots:
        if h == "/" or not os.path.isdir(h):
            raise ValueError(f"hidden {h!r} must be a folder other than /")
        if _within(h, work) and h != work:
            raise ValueError(f"hidden {h!r} lies inside workdir {work!r}")
    writes = [os.path.realpath(w) for w in (candidate_writable() if writable is None else writable)]
    for w in writes:
        if any(_within(w, h) for h in roots) and not _within(w, work):
            raise ValueError(f"writable {w!r} lies inside hidden {next(h for h in roots if _within(w, h))!r}")
    if set_tmpdir:
        # Also where nothing can be enforced, so a candidate's process behaves the same on every kernel.
        os.environ["TMPDIR"] = work
        tempfile.tempdir = None
    report = SandboxReport(hidden=roots)
    try:
        _enforce(report, work, roots, writes, drop_capabilities, shared_memory)
    finally:
        report.elapsed_ms = (time.perf_counter() - start) * 1e3
    return report


def _enforce(report: SandboxReport, work: str, roots: list[str], writes: list[str], drop_caps: bool,
             shared_memory: bool = True) -> None:
    sys_ = _Syscalls.load()
    if isinstance(sys_, str):
        report.reason = sys_
        return
    abi = sys_.abi()
    if isinstance(abi, str):
        report.reason = abi
        return
    report.abi = abi
    handled = (1 << 13) - 1  # ABI 1's thirteen rights, EXECUTE to MAKE_SYM
    if abi >= 2:
        handled |= FS_REFER
    if abi >= 3:
        handled |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = sys_.call(sys_.create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        report.reason = f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}"
        return
    try:
        for entry in list(writes):
            try:
                os.makedirs(entry, exist_ok=True)
            except OSError as e:
                writes.remove(entry)
                report.skipped.append(f"{entry} ({e.strerror})")
        roots = roots + _bind_aliases(roots)
        report.hidden = roots
        holes = set(roots)
        dev = "/dev" if os.path.isdir("/dev") and not os.path.islink("/dev") else None
        grants: list[tuple[str, int]] = []
        grants += _expand("/", _READ, holes | ({dev} if dev else set()), report.skipped)
        if dev:
            grants += _dev_grants(dev, handled, holes, report.skipped, shared_memory)
        for entry in writes:
            grants += _expand(entry, handled, holes, report.skipped)
        grants.append((work, handled))
        # The CUDA driver opens its threads' entries under /proc/<pid>/task to write them, truncating, as it
        # initialises (cudaGetDeviceCount fails with "OS call failed" otherwise); they reach this process's own
        # threads only.
        tasks = f"/proc/{os.getpid()}/task"
        if os.path.isdir(tasks):
            grants.append((tasks, _READ | FS_WRITE_FILE | FS_TRUNCATE))
        # A folder that is a hidden root or one of its ancestors under another name (a bind mount the mount table
        # did not show) would grant the whole hidden tree: such a grant is dropped.
        barred = _ancestor_inodes(roots)
        for path, rights in grants:
            if _add_rule(sys_, ruleset, path, rights & handled, barred):
                report.rules += 1
            else:
                report.skipped.append(path)
        if sys_.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            report.reason = f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
            return
        if drop_caps:
            report.capabilities_dropped = _drop_capabilities(sys_)
        flags = _RESTRICT_SELF_TSYNC if abi >= 8 else 0
        others = _thread_count() - 1
        rc = sys_.call(sys_.restrict, ctypes.c_int(ruleset), ctypes.c_uint32(flags))
        if rc != 0 and flags:
            flags = 0
            rc = sys_.call(sys_.restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        if rc != 0:
            report.reason = f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}"
            return
        report.enforced = True
        report.all_threads = bool(flags)
        report.threads_left = 0 if flags else others
        report.network_denied = abi >= 4
        report.scoped = abi >= 6
    finally:
        os.close(ruleset)


class _Syscalls:
    def __init__(self, libc: ctypes.CDLL, numbers: tuple[int, int, int]) -> None:
        self.libc = libc
        self.create, self.add, self.restrict = numbers
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.prctl = libc.prctl
        self.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        self.prctl.restype = ctypes.c_int

    @classmethod
    def load(cls) -> _Syscalls | str:
        if not sys.platform.startswith("linux"):
            return f"Landlock is a Linux feature; this is {sys.platform}"
        arch = platform.machine()
        if arch not in _SYSCALLS:
            return f"no Landlock system call numbers known for the {arch} architecture"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return cls(libc, _SYSCALLS[arch])
        except (OSError, AttributeError) as e:
            return f"the C library's syscall() is not reachable: {e}"

    def call(self, number: int, *args: object) -> int:
        return int(self.syscall(ctypes.c_long(number), *args))

    def abi(self) -> int | str:
        """The kernel's Landlock ABI version, or why there is none. Under a seccomp filter the first call is made
        in a throwaway child, since a filter may kill the caller instead of refusing the call."""
        if _seccomp_filtered():
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = int(self.call(self.create, None, ctypes.c_size_t(0),
                                         ctypes.c_uint32(_CREATE_RULESET_VERSION)) <= 0)
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                return f"a seccomp filter kills the process on landlock_create_ruleset (signal {os.WTERMSIG(status)})"
        version = self.call(self.create, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
        if version > 0:
            return version
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "the kernel has no Landlock system calls (older than 5.13, built without it, or a "
                             "seccomp filter or a user-space kernel refusing them)",
               errno.EOPNOTSUPP: "Landlock is built into the kernel but disabled at boot (the lsm= list)",
               errno.EPERM: "a seccomp filter refuses the Landlock system calls"}
        return why.get(err, f"landlock_create_ruleset(VERSION) failed: {os.strerror(err)}")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _expand(path: str, rights: int, holes: set[str], skipped: list[str]) -> list[tuple[str, int]]:
    """Grants giving ``rights`` on the tree at ``path`` save the ``holes`` in it: each folder on the way to a hole
    is split into its entries. Symbolic links are left out; they lead to something granted, or hidden, on their
    own."""
    if path in holes:
        return []
    if not any(_within(h, path) for h in holes):
        return [(path, rights)]
    out: list[tuple[str, int]] = []
    try:
        entries = list(os.scandir(path))
    except OSError as e:
        skipped.append(f"{path} ({e.strerror})")
        return out
    for entry in entries:
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                out += _expand(entry.path, rights, holes, skipped)
            else:
                out.append((entry.path, rights))
        except OSError as e:
            skipped.append(f"{entry.path} ({e.strerror})")
    return out


def _dev_grants(dev: str, handled: int, holes: set[str], skipped: list[str],
                shared_memory: bool = True) -> list[tuple[str, int]]:
    # Listing is harmless (a folder's names, never a file's content) and device libraries scan /dev for their nodes.
    out = _expand(dev, FS_READ_DIR, holes, skipped)
    for entry in os.scandir(dev):
        if entry.name.startswith(_DEV_WITHHELD_PREFIXES):
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError as e:
            skipped.append(f"{entry.path} ({e.strerror})")
            continue
        if stat.S_ISLNK(mode) or stat.S_ISBLK(mode):
            continue
        if stat.S_ISDIR(mode):
            # Shared memory (torch's, the CUDA driver's IPC) needs files made and removed there.
            if entry.name == "shm":
                rights = handled if shared_memory else _READ
            else:
                rights = _DEVICE
            out += _expand(entry.path, rights, holes, skipped)
        else:
            out.append((entry.path, _DEVICE & _FILE_RIGHTS))
    return out


def _bind_aliases(roots: list[str]) -> list[str]:
    """Other paths at which a hidden root is mounted (a bind mount of it, of a folder above it or of the whole
    filesystem), read from /proc/self/mountinfo: Landlock follows the path walked, so each alias is hidden too."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [_mount_fields(line) for line in f]
    except OSError:
        return []
    mounts = [m for m in mounts if m is not None]
    aliases: list[str] = []
    for h in roots:
        holders = [m for m in mounts if _within(h, m[2])]
        if not holders:
            continue
        device, fs_root, point = max(holders, key=lambda m: len(m[2]))
        inside = os.path.join(fs_root, os.path.relpath(h, point)).rstrip("/") if h != point else fs_root
        for dev2, root2, point2 in mounts:
            if dev2 != device or point2 == point:
                continue
            if _within(inside, root2):
                alias = os.path.normpath(os.path.join(point2, os.path.relpath(inside, root2)))
            elif _within(root2, inside):
                alias = point2
            else:
                continue
            if alias not in roots and alias not in aliases and alias != "/" and os.path.isdir(alias):
                aliases.append(alias)
    return aliases


def _mount_fields(line: str) -> tuple[str, str, str] | None:
    fields = line.split()
    if len(fields) < 5:
        return None

    def unescape(s: str) -> str:
        return s.encode().decode("unicode_escape") if "\\" in s else s

    return fields[2], unescape(fields[3]), unescape(fields[4])


def _ancestor_inodes(roots: list[str]) -> set[tuple[int, int]]:
    out = set()
    for h in roots:
        path = h
        while True:
            st = os.stat(path)
            out.add((st.st_dev, st.st_ino))
            if path == "/":
                break
            path = os.path.dirname(path)
    return out


def _add_rule(sys_: _Syscalls, ruleset: int, path: str, rights: int, barred: set[tuple[int, int]]) -> bool:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) in barred:
            return False
        if not stat.S_ISDIR(st.st_mode):
            rights &= _FILE_RIGHTS
        if not rights:
            return False
        attr = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        return sys_.call(sys_.add, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr),
                         ctypes.c_uint32(0)) == 0
    finally:
        os.close(fd)


def _drop_capabilities(sys_: _Syscalls) -> bool:
    """Empty every capability set. The bounding set first (that needs CAP_SETPCAP, which goes last): it is what a
    root process would get back from running a program."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        sys_.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    sys_.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(version=_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()
    capset = sys_.libc.capset
    capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    capset.restype = ctypes.c_int
    if capset(ctypes.byref(header), data) != 0:
        log.debug("capset failed: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def _seccomp_filtered() -> bool:
    try:
        with open("/proc/self/status") as f:
            return any(line.split()[1:] == ["2"] for line in f if line.startswith("Seccomp:"))
    except OSError:
        return False


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1

