"""The serving stacks the integration tests run against, imported for real: skipped where a stack is not installed,
failed under ``CI=true``, where ``make test`` installs every one of them (docs/serving.md), so a CI run without a
stack cannot pass while testing nothing."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path
from types import ModuleType

import pytest

from tests.postgres_server import _in_ci


def require_stack(module: str, how: str) -> ModuleType:
    """Import ``module`` of a serving stack, or skip (fail under CI) saying why and ``how`` to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # a stack missing, or one of the packages its module imports
        reason = f"{module} does not import ({type(e).__name__}: {e}); {how}"
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def plugin_module(group: str, name: str = "kernelsmith") -> ModuleType:
    """The module of our entry point in ``group``, imported by the name the installed metadata gives it: the one a
    stack's plugin loader imports (``kernelsmith_integrations.*`` when installed), not the checkout's
    ``integrations`` package, which is the same code under another module name with a state of its own."""
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    if not found:
        reason = f"no {name!r} entry point in {group!r}: kernelsmith is not installed here (pip install -e .)"
        if _in_ci():
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return importlib.import_module(found[0].module)


def export_stack_pack(root: Path, stack: str, hidden: int, inter: int, eps: float, tokens: int,
                      dtype: str | None = None) -> tuple[int, dict, Path]:
    """``kernelsmith pack export --for llama --stack STACK`` for a small Llama-style config at ``tokens`` tokens a
    forward, under the interpreter with a budget of one, in a kernelsmith home of its own under ``root``: the
    command's exit code, its JSON report and the pack's path."""
    import contextlib
    import io
    import json
    import os

    from ks_inductor.cli import main
    from ks_inductor.compiler import backend as B

    pack = root / f"{stack}.kspack"
    old = os.environ.get("KERNELSMITH_HOME")
    os.environ["KERNELSMITH_HOME"] = str(root / "home")
    try:
        argv = ["pack", "export", "--for", "llama", "--stack", stack, "--hf-set", f"hidden_size={hidden}",
                "--hf-set", f"intermediate_size={inter}", "--hf-set", f"rms_norm_eps={eps}", "--batch", "1",
                "--seq", str(tokens), *(["--dtype", dtype] if dtype else []), "--db", str(root / "k.db"),
                "-o", str(pack), "--budget", "1", "--backend", "triton-interpret", "--json"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(argv)
    finally:
        B.forget_stores()
        if old is None:
            os.environ.pop("KERNELSMITH_HOME", None)
        else:
            os.environ["KERNELSMITH_HOME"] = old
    return rc, json.loads(out.getvalue().strip().splitlines()[-1]), pack


def layer_pack(root: Path, stack: str, hidden: int, inter: int, eps: float, tokens: int, dtype: str | None = None,
               lead: tuple[int, ...] = (), weight_before_residual: bool = False) -> Path:
    """:func:`export_stack_pack`, checked: it exits 0 with the stack's three layer problems (RMSNorm, RMSNorm with the
    residual, SiLU·mul), each with a kernel and golden vectors, at ``(*lead, tokens, ...)`` float32 activations; the
    residual RMSNorm's inputs in the stack's order (``weight_before_residual``: x, weight, residual). The pack's
    path."""
    rc, built, path = export_stack_pack(root, stack, hidden, inter, eps, tokens, dtype)
    assert rc == 0 and built["missing"] == [] and built["kernels"] == 3 and built["with_vectors"] == 3, built
    rows = ", ".join(str(d) for d in (*lead, tokens))
    x, weight = f"float32[{rows}, {hidden}]", f"float32[{hidden}]"
    add = f"{x}, {weight}, {x}" if weight_before_residual else f"{x}, {x}, {weight}"
    assert sorted((p["name"], p["inputs"]) for p in built["problems"]) == [
        ("add_rmsnorm", add), ("rmsnorm", f"{x}, {weight}"), ("silu_and_mul", f"float32[{rows}, {2 * inter}]")]
    return path
