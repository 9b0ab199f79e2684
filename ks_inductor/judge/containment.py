"""A candidate's processes stay where the judge ends them, and below the trusted side on the host's cores.

The judge ends a job by killing its worker's process group. A candidate's process could leave that group
(``setsid``, ``setpgid``) from a child it forks, and the child would outlive the job: a process that keeps every
core busy while the trusted side times the baselines and the other candidates makes their launches late, and a
timing that let launch delays into its events would find the peers slower. ``contain()`` closes both ways out with
a seccomp filter (the two calls fail with EPERM in this process and everything it starts), and lowers the
process's scheduling priority (``CANDIDATE_NICE``; an unprivileged process cannot raise it again), so that on a
crowded host the jobs that time and compare run first.

The filter needs no privilege (``PR_SET_NO_NEW_PRIVS`` is set first) and knows the x86-64 and AArch64 call numbers;
elsewhere, or where the kernel refuses a filter, ``contain`` says so and the priority alone stands.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

CANDIDATE_NICE = 10

# audit architecture, and the call numbers of setsid and setpgid (x86-64's x32 ABI numbers too)
_ARCH = {
    "x86_64": (0xC000003E, (112, 109, 0x40000000 | 112, 0x40000000 | 109)),
    "aarch64": (0xC00000B7, (157, 154)),
}
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1
# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06


def _program(arch: int, numbers: tuple[int, ...]) -> bytes:
    """The filter: another architecture's calls are allowed as they are (a 32-bit call cannot name these numbers
    the same way, and this process makes none); on this one, the listed calls fail with EPERM."""
    n = len(numbers)
    ins = [(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
           (_JEQ_K, 0, n + 1, arch),  # other architecture: to ALLOW
           (_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    for i, nr in enumerate(numbers):
        ins.append((_JEQ_K, n - i, 0, nr))  # match: jump to ERRNO
    ins += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | _EPERM)]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _filter_group_changes() -> str:
    if not sys.platform.startswith("linux"):
        return f"no seccomp on {sys.platform}"
    known = _ARCH.get(platform.machine())
    if known is None:
        return f"no call numbers known for {platform.machine()}"
    code = _program(*known)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.prctl.restype = ctypes.c_int
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        return f"the seccomp filter was refused: {os.strerror(ctypes.get_errno())}"
    return ""


def contain() -> str:
    """Keep this process and whatever it starts in its process group, at a lower priority. Returns what held:
    'process group kept, nice N', or what could not be put in place and why."""
    parts = []
    why = _filter_group_changes()
    parts.append(f"process group not kept: {why}" if why else "process group kept")
    try:
        now = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, max(now, CANDIDATE_NICE))
        parts.append(f"nice {os.getpriority(os.PRIO_PROCESS, 0)}")
    except OSError as e:
        parts.append(f"priority not lowered: {e.strerror}")
    return ", ".join(parts)
