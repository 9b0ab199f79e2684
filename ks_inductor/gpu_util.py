"""GPU utilisation sampled in a background thread while a run goes on, averaged per GPU over the run.

Sources, first that works: NVML through ``pynvml`` (the ``nvidia-ml-py`` package), else ``nvidia-smi`` run once per
sample, else none (a CPU host: nothing is sampled, nothing is shown). The figure is the driver's
``utilization.gpu``: the share of the last sample period during which a kernel ran on the GPU.

    with GpuSampler() as gpu:
        ...                      # the run
    gpu.summary()                # [{"gpu": 0, "mean": 71.5, "max": 100.0, "samples": 120}, ...]
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# Once a second: nvidia-smi costs a process per sample, and a warm run lasts minutes.
DEFAULT_INTERVAL_S = 1.0
SMI_QUERY = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]


def parse_smi_csv(text: str) -> dict[int, float]:
    """``nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits`` → {index: percent}; lines it
    cannot read (``[N/A]``, a driver's warning) are left out."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            out[int(parts[0])] = float(parts[1])
        except ValueError:
            continue
    return out


def visible_indices(env: dict[str, str] | None = None) -> set[int] | None:
    """The GPUs this process may use, by index, from ``CUDA_VISIBLE_DEVICES``; None when every GPU is visible or
    the variable names GPUs by UUID (then every GPU is shown rather than a guess)."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    try:
        return {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        return None


def _nvml_reader() -> Callable[[], dict[int, float]] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as e:  # noqa: BLE001 - NVML without a driver (a CPU host) raises its own error types
        log.debug("NVML unavailable: %s", e)
        return None

    def read() -> dict[int, float]:
        return {i: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for i, h in handles}

    return read


def _smi_reader(executable: str = "nvidia-smi") -> Callable[[], dict[int, float]] | None:
    path = shutil.which(executable)
    if path is None:
        return None

    def read() -> dict[int, float]:
        done = subprocess.run([path, *SMI_QUERY], capture_output=True, text=True, timeout=10)
        return parse_smi_csv(done.stdout) if done.returncode == 0 else {}

    try:
        if not read():
            return None  # present but sees no GPU (or a driver mismatch): nothing to show
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("nvidia-smi unusable: %s", e)
        return None
    return read


def find_reader(source: str = "auto") -> tuple[str | None, Callable[[], dict[int, float]] | None]:
    """(name, reader) of the first source that works among ``source`` ("auto", "nvml", "nvidia-smi", "none")."""
    if source in ("auto", "nvml"):
        reader = _nvml_reader()
        if reader is not None:
            return "nvml", reader
    if source in ("auto", "nvidia-smi"):
        reader = _smi_reader()
        if reader is not None:
            return "nvidia-smi", reader
    return None, None


class GpuSampler:
    """Samples every ``interval_s`` in a daemon thread between :meth:`start` and :meth:`stop`; ``gpus`` keeps only
    those indices (default: the ones ``CUDA_VISIBLE_DEVICES`` leaves visible)."""

    def __init__(self, interval_s: float | None = None, source: str = "auto",
                 gpus: Iterable[int] | None = None) -> None:
        self.interval_s = DEFAULT_INTERVAL_S if interval_s is None else interval_s
        self.wanted = set(gpus) if gpus is not None else visible_indices()
        self.source, self._read = find_reader(source)
        self._sums: dict[int, float] = {}
        self._max: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self.latest: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._read is not None

    def sample(self) -> dict[int, float]:
        """Take one sample now and add it to the averages."""
        if self._read is None:
            return {}
        try:
            got = self._read()
        except Exception as e:  # noqa: BLE001 - a failed sample is skipped, the run goes on
            log.debug("GPU utilisation sample failed: %s", e)
            return {}
        if self.wanted is not None:
            got = {i: v for i, v in got.items() if i in self.wanted}
        with self._lock:
            for i, v in got.items():
                self._sums[i] = self._sums.get(i, 0.0) + v
                self._counts[i] = self._counts.get(i, 0) + 1
                self._max[i] = max(self._max.get(i, 0.0), v)
            self.latest = got
        return got

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def start(self) -> GpuSampler:
        if self._read is not None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="ks-gpu-util", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=15)
            self._thread = None

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def means(self) -> dict[int, float]:
        with self._lock:
            return {i: self._sums[i] / self._counts[i] for i in sorted(self._counts)}

    def summary(self) -> list[dict[str, Any]]:
        """Per GPU over the samples so far: mean and max percent, and how many samples."""
        with self._lock:
            return [{"gpu": i, "mean": round(self._sums[i] / self._counts[i], 1), "max": self._max[i],
                     "samples": self._counts[i]} for i in sorted(self._counts)]

    def text(self, latest: bool = False) -> str:
        """One line for a progress view: ``GPU 0 71% 1 65%`` (the means, or the latest sample); empty without
        samples."""
        values = dict(self.latest) if latest else self.means()
        if not values:
            return ""
        return "GPU " + " ".join(f"{i} {v:.0f}%" for i, v in sorted(values.items()))


def mean_of(summary: list[dict[str, Any]], gpus: Iterable[int] | None = None) -> float | None:
    """The mean utilisation over ``gpus`` (default all) of a :meth:`GpuSampler.summary`; None without samples."""
    keep = None if gpus is None else set(gpus)
    values = [g["mean"] for g in summary if keep is None or g["gpu"] in keep]
    return sum(values) / len(values) if values else None
