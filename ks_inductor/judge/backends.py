"""Hardware backends behind one interface: triton-cuda, triton-maca, triton-interpret.

Everything hardware-specific the judge needs lives here: how to detect the platform, the environment a worker
runs in, the fingerprint, the L2 size to flush and nominal peak rates for the plausibility gate. MetaX MACA is
built from documented behaviour (shared/research/D_serving_maca.md) and has not run on MetaX hardware.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ks_core.fingerprint import (
    BACKEND_CPU_INTERPRET,
    BACKEND_CUDA,
    BACKEND_MACA,
    EnvFingerprint,
)
from ks_core.settings import Settings
from ks_inductor.judge.device_lock import physical_device_name, visible_device

log = logging.getLogger(__name__)

TRITON_CUDA = "triton-cuda"
TRITON_MACA = "triton-maca"
TRITON_INTERPRET = "triton-interpret"
BACKEND_NAMES = (TRITON_CUDA, TRITON_MACA, TRITON_INTERPRET)


class BackendUnavailable(RuntimeError):
    pass


@dataclass
class PlatformProbe:
    """What the machine says about itself; gathered by :func:`probe_platform`, constructed directly in tests."""

    cuda_available: bool = False
    device_count: int = 0
    torch_version_maca: str | None = None
    torch_version_hip: str | None = None
    torch_version: str = ""
    triton_target_backend: str | None = None
    mx_smi_path: str | None = None
    device_names: list[str] = field(default_factory=list)


def probe_platform() -> PlatformProbe:
    import torch

    probe = PlatformProbe(
        torch_version=torch.__version__,
        torch_version_maca=getattr(torch.version, "maca", None),
        torch_version_hip=getattr(torch.version, "hip", None),
        mx_smi_path=shutil.which("mx-smi") or (
            "/opt/mxdriver/bin/mx-smi" if os.path.exists("/opt/mxdriver/bin/mx-smi") else None
        ),
    )
    if Settings.read("triton_interpret"):
        return probe  # the interpreter was asked for explicitly; don't touch a GPU
    try:
        probe.cuda_available = torch.cuda.is_available()
        probe.device_count = torch.cuda.device_count() if probe.cuda_available else 0
        probe.device_names = [torch.cuda.get_device_name(i) for i in range(probe.device_count)]
    except Exception as e:  # noqa: BLE001 - a broken driver means "no GPU", not a crash
        log.warning("CUDA probe failed: %s", e)
    if probe.cuda_available:
        try:
            import triton

            probe.triton_target_backend = triton.runtime.driver.active.get_current_target().backend
        except Exception as e:  # noqa: BLE001
            log.debug("triton target probe failed: %s", e)
    return probe


def is_maca(probe: PlatformProbe) -> bool:
    """MetaX MACA shows up as device type 'cuda'; torch.version.cuda/hip cannot tell it apart, so use the
    MACA-specific signals: torch.version.maca, a '+metax' torch build, Triton's 'maca' target, mx-smi, or a
    'MetaX' device name."""
    return bool(
        probe.torch_version_maca
        or "metax" in probe.torch_version.lower()
        or probe.triton_target_backend == "maca"
        or (probe.cuda_available and probe.mx_smi_path)
        or any(n.lower().startswith("metax") for n in probe.device_names)
    )


def select_backend_name(requested: str | None, probe: PlatformProbe) -> str:
    if requested:
        if requested not in BACKEND_NAMES:
            raise BackendUnavailable(f"unknown backend {requested!r}; choose one of {', '.join(BACKEND_NAMES)}")
        if requested in (TRITON_CUDA, TRITON_MACA) and not probe.cuda_available:
            raise BackendUnavailable(
                f"backend {requested} needs a GPU, but torch sees none; use --backend triton-interpret on CPU"
            )
        if requested == TRITON_CUDA and is_maca(probe):
            raise BackendUnavailable("this is a MetaX MACA machine; use --backend triton-maca")
        if requested == TRITON_MACA and not is_maca(probe):
            raise BackendUnavailable("no MetaX MACA platform detected (torch.version.maca, mx-smi, Triton 'maca')")
        return requested
    if probe.cuda_available:
        return TRITON_MACA if is_maca(probe) else TRITON_CUDA
    return TRITON_INTERPRET


# Nominal dense peaks (FLOP/s) per dtype for the plausibility gate; conservative upper bounds, not targets.
_PEAKS = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12, "bandwidth": 4.8e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12, "bandwidth": 3.35e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12, "bandwidth": 2.04e12},
    "MetaX C500": {"bfloat16": 280e12, "float16": 280e12, "float32": 140e12, "bandwidth": 1.8e12},
}


@dataclass
class JudgeBackend:
    name: str
    fingerprint_backend: str
    device: str  # "cuda" or "cpu"
    timed: bool
    warp_size: int
    worker_env: dict[str, str] = field(default_factory=dict)

    def fingerprint(self, index: int = 0) -> EnvFingerprint:
        import torch
        import triton

        if self.device == "cpu":
            return EnvFingerprint(
                backend=self.fingerprint_backend,
                device_name=f"cpu:{platform.machine()}",
                capability="interpret",
                warp_size=1,
                sm_count=1,
                torch_version=torch.__version__,
                triton_version=triton.__version__,
                toolchain="triton-interpreter",
            )
        props = torch.cuda.get_device_properties(index)
        if self.name == TRITON_MACA:
            capability = f"maca:{props.major}.{props.minor}"
            toolchain = f"maca-{getattr(torch.version, 'maca', None) or 'unknown'} {_mxcc_version()}"
        else:
            capability = f"sm_{props.major}{props.minor}"
            toolchain = f"cuda-{torch.version.cuda}"
        return EnvFingerprint(
            backend=self.fingerprint_backend,
            device_name=props.name,
            capability=capability,
            warp_size=int(getattr(props, "warp_size", self.warp_size) or self.warp_size),
            sm_count=int(props.multi_processor_count),
            torch_version=torch.__version__,
            triton_version=triton.__version__,
            toolchain=toolchain,
        )

    def l2_bytes(self, index: int = 0) -> int:
        if self.device == "cpu":
            return 0
        from ks_inductor.judge.timing import device_l2_bytes

        return device_l2_bytes(index)

    def device_id(self, index: int | None = None) -> str:
        """The name under which every kernelsmith process on the host locks device ``index`` of this process
        (``device_lock``): ``cpu`` for the interpreter, else the GPU's UUID, the same whatever each process's
        ``CUDA_VISIBLE_DEVICES``."""
        if self.device == "cpu":
            return "cpu"
        return physical_device_name(index)

    def nominal_peaks(self, device_name: str) -> dict[str, float]:
        for k, v in _PEAKS.items():
            if k.lower() in device_name.lower():
                return v
        return {}


def _mxcc_version() -> str:
    maca = os.environ.get("MACA_PATH", "/opt/maca")
    mxcc = os.path.join(maca, "mxgpu_llvm", "bin", "mxcc")
    if not os.path.exists(mxcc):
        return "mxcc-unknown"
    try:
        out = subprocess.run([mxcc, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0].strip() if out else "mxcc-unknown"
    except (OSError, subprocess.SubprocessError):
        return "mxcc-unknown"


def backend_for(name: str) -> JudgeBackend:
    if name == TRITON_CUDA:
        return JudgeBackend(name, BACKEND_CUDA, "cuda", True, 32)
    if name == TRITON_MACA:
        # 64-lane warps; num_warps therefore means twice the threads of an NVIDIA launch.
        return JudgeBackend(name, BACKEND_MACA, "cuda", True, 64)
    if name == TRITON_INTERPRET:
        return JudgeBackend(name, BACKEND_CPU_INTERPRET, "cpu", False, 1, {"TRITON_INTERPRET": "1"})
    raise BackendUnavailable(f"unknown backend {name!r}")


def detect_backend(name: str | None = None, probe: PlatformProbe | None = None) -> JudgeBackend:
    return backend_for(select_backend_name(name, probe or probe_platform()))


def current_fingerprint(name: str | None = None) -> EnvFingerprint:
    return detect_backend(name).fingerprint()


def worker_environment(backend: JudgeBackend, device_index: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(backend.worker_env)
    if backend.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device_index is not None:
        device = visible_device(device_index, os.environ.get("CUDA_VISIBLE_DEVICES") or (
            os.environ.get("MACA_VISIBLE_DEVICES") if backend.name == TRITON_MACA else None))
        env["CUDA_VISIBLE_DEVICES"] = device
        if backend.name == TRITON_MACA:
            env["MACA_VISIBLE_DEVICES"] = device
    # Correctness is judged with synchronous launches' error reporting available; the worker retires on any
    # device error anyway.
    env.setdefault("TORCH_USE_CUDA_DSA", "1")
    if backend.device != "cpu":
        # A GPU worker's host work is copies and file writes; dozens of workers, each with a thread per core,
        # would oversubscribe the host that the judge's comparisons and the compilers share.
        env.setdefault("OMP_NUM_THREADS", "2")
    # The Inductor baseline a worker compiles is one small graph; a pool of compile workers per judge worker (one
    # per core each) would put hundreds of processes on the host during a parallel warm.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["PYTHONHASHSEED"] = "0"
    return env


def describe(backend: JudgeBackend) -> dict[str, Any]:
    return {"name": backend.name, "device": backend.device, "timed": backend.timed, "warp_size": backend.warp_size}
