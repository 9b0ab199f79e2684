"""A LlamaRMSNorm layer at (2, 8, 64) float32, its input and its own output, and a pack built for it by the real
pipeline: what the serving tests build packs for and serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.stacks import require_stack


@pytest.fixture(scope="module", autouse=True)
def _transformers() -> None:
    """Imported by a test module: its tests need transformers' Llama."""
    require_stack("transformers.models.llama.modeling_llama", "pip install -e '.[dev]' installs transformers")


@pytest.fixture(autouse=True)
def _no_serving_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported by a test module: no serving variable of the environment reaches its tests."""
    from integrations.serving import SERVING_ENV

    for k in SERVING_ENV:
        monkeypatch.delenv(k, raising=False)

HIDDEN = 64
SHAPE = (2, 8, HIDDEN)


def norm_layer() -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(HIDDEN).eval()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
    return norm


def hidden() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))


def own_output(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    with torch.no_grad():
        return LlamaRMSNorm.forward(norm, x)


def build_norm_pack(root: Path, judge: Any) -> Path:
    """A pack holding one kernel for the layer, searched (budget 1, the interpreter) and judged by ``judge``; its
    cache is ``root / "k.db"``."""
    from rich.console import Console

    from integrations.transformers import pack_for_model
    from ks_inductor.evolve import EvolveConfig

    build = pack_for_model(norm_layer(), [(hidden(),)], root / "norm.kspack", db=str(root / "k.db"), judge=judge,
                           config=EvolveConfig(budget=1, backend="triton-interpret"),
                           console=Console(stderr=True, quiet=True))
    assert build.missing == [] and build.export is not None, build.warm.to_json()
    return root / "norm.kspack"
