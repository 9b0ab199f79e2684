"""Environment fingerprints and the one rule for when a kernel verified elsewhere may serve here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

BACKEND_CUDA = "cuda"
BACKEND_MACA = "maca"
BACKEND_CPU_INTERPRET = "cpu-interpret"


@dataclass(frozen=True)
class EnvFingerprint:
    """Where a kernel was verified. ``capability`` is prefixed by the backend so that a MetaX C500, which reports
    sm_80, can never collide with an NVIDIA A100."""

    backend: str
    device_name: str
    capability: str
    warp_size: int
    sm_count: int
    torch_version: str
    triton_version: str
    toolchain: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EnvFingerprint:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    @property
    def id(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def hardware_id(self) -> str:
        """Identity of the hardware alone (no software versions): the unit kernels are tuned for."""
        hw = (self.backend, self.device_name, self.capability, self.warp_size, self.sm_count)
        return hashlib.sha256(repr(hw).encode()).hexdigest()[:16]

    @property
    def timed(self) -> bool:
        """Whether timings taken in this environment mean anything (the interpreter's do not)."""
        return self.backend != BACKEND_CPU_INTERPRET

    def short(self) -> str:
        return f"{self.backend}:{self.device_name}:{self.capability}"


def minor_version(version: str) -> str:
    """``2.11.0+cu130`` -> ``2.11``."""
    return ".".join(version.split("+")[0].split(".")[:2])


MATCH_EXACT = "exact"
MATCH_REVERIFY = "reverify"
MATCH_NONE = "none"


def match(stored: EnvFingerprint, current: EnvFingerprint) -> str:
    """Compare a kernel's fingerprint with this machine's.

    ``exact``: same hardware and the same torch and triton minor versions: serve it.
    ``reverify``: same hardware, other torch/triton minor versions or toolchain: serve only after the judge
    verifies it again here. ``none``: other hardware or backend: never serve.
    """
    if stored.hardware_id != current.hardware_id:
        return MATCH_NONE
    same_sw = (
        minor_version(stored.torch_version) == minor_version(current.torch_version)
        and minor_version(stored.triton_version) == minor_version(current.triton_version)
        and stored.toolchain.split(" ")[0] == current.toolchain.split(" ")[0]
    )
    return MATCH_EXACT if same_sw else MATCH_REVERIFY
