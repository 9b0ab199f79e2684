"""The fixture every command-line test module uses: a kernelsmith home of its own and no cache left open."""

from __future__ import annotations

import pytest
import torch

import ks_inductor.compiler.backend as B


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERNELSMITH_DB", raising=False)
    torch._dynamo.reset()
    yield
    B.forget_stores()
