"""The judge's sandbox (ks_inductor/judge/sandbox.py): a confined process cannot read the judge's scratch folder
beyond its own job's, cannot write outside its job and caches, cannot open TCP connections, and still imports torch
and triton and runs a Triton kernel. Each case runs in a fresh interpreter, since confinement cannot be undone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What every child does first: a scratch root like the judge's, with the job's folder and a reference's output
# beside it, then confinement. Results go out as one JSON line.
_PRELUDE = r"""
import errno, json, os, socket, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from ks_inductor.judge import sandbox

scratch, outside = sys.argv[2], sys.argv[3]
work = os.path.join(scratch, "cand-1")
results = {}

def attempt(name, fn):
    try:
        results[name] = {"ok": True, "value": fn()}
    except OSError as e:
        results[name] = {"ok": False, "errno": e.errno, "type": type(e).__name__}

"""

_MAIN = _PRELUDE + r"""
if os.environ.get("KS_SANDBOX_CUDA_FIRST"):
    # As the judge's worker does: the device context exists (with the driver's threads) before confinement.
    import torch
    torch.empty(1, device="cuda")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
before = time.perf_counter()
report = sandbox.confine(work, [scratch], sandbox.candidate_writable())
results["wall_ms"] = (time.perf_counter() - before) * 1e3
results["report"] = {k: getattr(report, k) for k in ("enforced", "reason", "abi", "network_denied", "scoped",
                                                        "capabilities_dropped", "elapsed_ms", "rules",
                                                        "threads_left", "all_threads")}

def read(path):
    with open(path) as f:
        return f.read()

def write(path, text="x"):
    with open(path, "w") as f:
        f.write(text)
    return read(path)

attempt("sibling_read", lambda: read(os.path.join(scratch, "ref-1", "ref_0.safetensors")))
attempt("scratch_list", lambda: os.listdir(scratch))
attempt("work_rw", lambda: write(os.path.join(work, "note.txt"), "kept"))
attempt("work_subdir", lambda: (os.makedirs(os.path.join(work, "sub", "deeper")), os.listdir(work))[1])
attempt("outside_read", lambda: read(os.path.join(outside, "plain.txt")))
attempt("tmp_write", lambda: write(os.path.join(os.path.dirname(scratch), "escaped.txt")))
attempt("slash_tmp_write", lambda: write(f"/tmp/ks-sandbox-escape-{os.getpid()}"))
attempt("triton_cache_write", lambda: write(os.path.join(os.environ["TRITON_CACHE_DIR"], "entry.txt")))
attempt("dev_null", lambda: write("/dev/null") is not None)
attempt("tmpdir_is_work", lambda: __import__("tempfile").gettempdir())
attempt("connect", lambda: socket.create_connection(listener.getsockname(), timeout=5).close())
attempt("signal_outside", lambda: os.kill(int(os.environ["KS_OUTSIDE_PID"]), 0))
attempt("spawned_child_read", lambda: subprocess.run(
    ["cat", os.path.join(scratch, "ref-1", "ref_0.safetensors")], capture_output=True).returncode)

def capabilities():
    with open("/proc/self/status") as f:
        return {ln.split(":")[0]: int(ln.split()[1], 16) for ln in f if ln.startswith(("CapEff", "CapBnd"))}

attempt("capabilities", capabilities)

import torch
import triton
import triton.language as tl

attempt("torch_init_read", lambda: len(read(torch.__file__)))

@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)

device = "cuda" if os.environ.get("KS_SANDBOX_DEVICE") == "cuda" else "cpu"
x = torch.randn(6, 40, device=device)
w = torch.rand(40, device=device)
out = torch.empty_like(x)
_rmsnorm_kernel[(x.shape[0],)](x, w, out, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
results["kernel_max_err"] = float((out - expected).abs().max())
print(json.dumps(results))
"""


def _run_child(script: str, tmp: Path, env_extra: dict[str, str] | None = None) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="ks-judge-", dir=tmp))
    (scratch / "cand-1").mkdir()
    (scratch / "ref-1").mkdir()
    (scratch / "ref-1" / "ref_0.safetensors").write_text("the reference's outputs")
    (scratch / "logs").mkdir()
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "plain.txt").write_text("readable")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp / "triton-cache"), CUDA_CACHE_PATH=str(tmp / "nv-cache"),
               KS_OUTSIDE_PID=str(sleeper.pid), **(env_extra or {}))
    # A file, not ``-c``: Triton's JIT reads a kernel's source through inspect when it compiles for a GPU.
    child = tmp / f"child_{len(list(tmp.glob('child_*.py')))}.py"
    child.write_text(script)
    try:
        proc = subprocess.run([sys.executable, str(child), str(ROOT), str(scratch), str(outside)],
                              capture_output=True, text=True, env=env, timeout=300)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"scratch": str(scratch)}


@pytest.fixture(scope="module")
def confined(tmp_path_factory) -> dict:
    res = _run_child(_MAIN, tmp_path_factory.mktemp("sandbox"), {"TRITON_INTERPRET": "1"})
    if not res["report"]["enforced"]:
        pytest.skip(f"Landlock is unavailable here: {res['report']['reason']}")
    return res


def _denied(res: dict, name: str) -> bool:
    return not res[name]["ok"] and res[name]["type"] == "PermissionError"


def test_reference_outputs_beside_the_job_cannot_be_read(confined):
    assert _denied(confined, "sibling_read")


def test_scratch_root_cannot_be_listed(confined):
    assert _denied(confined, "scratch_list")


def test_a_program_the_candidate_starts_is_confined_too(confined):
    assert confined["spawned_child_read"] == {"ok": True, "value": 1}


def test_job_folder_is_readable_and_writable(confined):
    assert confined["work_rw"] == {"ok": True, "value": "kept"}
    assert confined["work_subdir"]["ok"] and "sub" in confined["work_subdir"]["value"]


def test_files_outside_the_scratch_root_stay_readable(confined):
    assert confined["outside_read"] == {"ok": True, "value": "readable"}
    assert confined["torch_init_read"]["ok"] and confined["torch_init_read"]["value"] > 0


def test_writes_outside_the_job_are_refused(confined):
    assert _denied(confined, "tmp_write")
    assert _denied(confined, "slash_tmp_write")


def test_caches_and_devices_stay_writable(confined):
    assert confined["triton_cache_write"] == {"ok": True, "value": "x"}
    assert confined["dev_null"] == {"ok": True, "value": True}


def test_temporary_files_go_to_the_job_folder(confined):
    assert confined["tmpdir_is_work"]["value"] == os.path.realpath(os.path.join(confined["scratch"], "cand-1"))


def test_tcp_connect_is_refused(confined):
    if confined["report"]["abi"] < 4:
        pytest.skip(f"Landlock ABI {confined['report']['abi']} has no network rules")
    assert confined["report"]["network_denied"]
    assert _denied(confined, "connect")


def test_signals_to_processes_outside_are_refused(confined):
    if confined["report"]["abi"] < 6:
        pytest.skip(f"Landlock ABI {confined['report']['abi']} has no signal scoping")
    assert _denied(confined, "signal_outside")


def test_capabilities_are_dropped(confined):
    assert confined["report"]["capabilities_dropped"]
    assert confined["capabilities"]["value"] == {"CapEff": 0, "CapBnd": 0}


def test_triton_kernel_runs_after_confinement(confined):
    assert confined["kernel_max_err"] < 1e-4


def test_confinement_is_cheap(confined):
    # A judgment of a small problem takes 300-700 ms; the sandbox must stay a small part of it.
    assert confined["report"]["elapsed_ms"] < 200, confined["report"]


_UNAVAILABLE = _PRELUDE + r"""
sandbox._SYSCALLS.clear()
report = sandbox.confine(work, [scratch], [])
results["report"] = {"enforced": report.enforced, "reason": report.reason}
attempt("sibling_read", lambda: open(os.path.join(scratch, "ref-1", "ref_0.safetensors")).read())
print(json.dumps(results))
"""


def test_without_landlock_nothing_is_enforced_and_the_reason_is_given(tmp_path):
    res = _run_child(_UNAVAILABLE, tmp_path)
    assert res["report"]["enforced"] is False
    assert "architecture" in res["report"]["reason"]
    assert res["sibling_read"]["ok"]


_BIND_ALIAS = _PRELUDE + r"""
alias = sys.argv[4]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "--bind", os.path.dirname(scratch), alias], check=True)
report = sandbox.confine(work, [scratch], [])
results["enforced"] = report.enforced
attempt("alias_read", lambda: open(os.path.join(alias, os.path.basename(scratch), "ref-1", "ref_0.safetensors")).read())
print(json.dumps(results))
"""


def test_a_bind_mount_of_the_scratch_folder_is_hidden_too(tmp_path):
    # A bind mount of the folder holding the scratch root puts the root's own inode under a granted sibling; the
    # sandbox must hide the alias rather than grant the whole tree through it.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    alias = tmp_path / "alias"
    alias.mkdir()
    inner = tmp_path / "inner"
    inner.mkdir()
    scratch = Path(tempfile.mkdtemp(prefix="ks-judge-", dir=inner))
    (scratch / "cand-1").mkdir()
    (scratch / "ref-1").mkdir()
    (scratch / "ref-1" / "ref_0.safetensors").write_text("the reference's outputs")
    proc = subprocess.run(["unshare", "-m", sys.executable, "-c", _BIND_ALIAS, str(ROOT), str(scratch), str(inner),
                           str(alias)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if not res["enforced"]:
        pytest.skip("Landlock is unavailable here")
    assert _denied(res, "alias_read")


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_first", [False, True], ids=["device-after", "device-before"])
def test_triton_compiles_and_runs_on_the_gpu_after_confinement(tmp_path, cuda_first):
    # The real workload: Triton writes PTX and a ptxas log to the temporary folder, builds its launcher with the C
    # compiler there, fills its cache, and CUDA drives the GPU through /dev, all after confinement.
    env = {"KS_SANDBOX_DEVICE": "cuda", "TRITON_INTERPRET": "0"}
    if cuda_first:
        env["KS_SANDBOX_CUDA_FIRST"] = "1"
    res = _run_child(_MAIN, tmp_path, env)
    if not res["report"]["enforced"]:
        pytest.skip(f"Landlock is unavailable here: {res['report']['reason']}")
    assert res["kernel_max_err"] < 1e-4
    assert _denied(res, "sibling_read")
    assert any(Path(tmp_path, "triton-cache").rglob("*.cubin"))


CONTAINED = r'''
import os, subprocess, sys
from ks_inductor.judge.containment import contain

summary = contain()
out = {"summary": summary, "nice": os.getpriority(os.PRIO_PROCESS, 0)}
try:
    os.setsid()
    out["setsid"] = "allowed"
except OSError as e:
    out["setsid"] = e.errno
child = subprocess.run([sys.executable, "-c", "import os\ntry:\n    os.setpgid(0, 0)\n    print('allowed')\nexcept OSError as e:\n    print(e.errno)"], capture_output=True, text=True)
out["child_setpgid"] = child.stdout.strip()
print(__import__("json").dumps(out))
'''


def test_a_contained_process_and_its_children_keep_their_group_at_a_lower_priority():
    """``containment.contain`` (what a candidate's process runs after the sandbox): ``setsid`` and ``setpgid`` fail
    with EPERM in the process and in a program it starts, and its priority is lowered to ``CANDIDATE_NICE``."""
    import errno

    from ks_inductor.judge.containment import CANDIDATE_NICE

    # Started in this process's group, not as a group leader: there setsid and setpgid succeed unless refused.
    proc = subprocess.run([sys.executable, "-c", CONTAINED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "process group not kept" in got["summary"]:
        pytest.skip(got["summary"])
    assert got["setsid"] == errno.EPERM and got["child_setpgid"] == str(errno.EPERM), got
    assert got["nice"] >= CANDIDATE_NICE, got
