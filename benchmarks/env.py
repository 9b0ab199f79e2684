"""What a result was measured on: device, driver, and the versions of every tool in the comparison."""

from __future__ import annotations

import importlib.metadata as md
import logging
import platform
import shutil
import subprocess
import sys
from typing import Any

log = logging.getLogger(__name__)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError) as e:
            log.debug("nvidia-smi failed: %s", e)
    try:
        import torch

        # The CUDA driver API reports its version as 1000*major + 10*minor.
        v = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        if v:
            return f"cuda-driver-api {v // 1000}.{(v % 1000) // 10}"
    except Exception as e:  # noqa: BLE001 - a missing driver only leaves the field empty
        log.debug("driver version probe failed: %s", e)
    return None


def collect_env(device: str) -> dict[str, Any]:
    import torch
    import triton

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernelsmith": _version("kernelsmith"),
        "liger_kernel": _version("liger-kernel") or _version("liger_kernel"),
        "cuda": torch.version.cuda,
    }
    if device == "cpu":
        env.update(device_name=f"cpu:{platform.machine()}", driver=None)
    else:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
            driver=_driver_version(),
        )
    try:
        from ks_inductor.judge.backends import detect_backend

        fp = detect_backend(None).fingerprint()
        env["fingerprint"] = fp.to_json()
        env["fingerprint_id"] = fp.id
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: the fingerprint only matters for lookups
        env["fingerprint_error"] = f"{type(e).__name__}: {e}"
    return env
