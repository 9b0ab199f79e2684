"""Kernels put in a cache by hand for the backend's tests: a model's norm region's key, and a kernel stored for it as
verified on this machine, with the launch plan its forward records (the backend runs a cached kernel's judged
plan, never its forward, and serves no kernel without one).

The plan is recorded here, in the test's process, as the judge records one: the kernels' launches, not run. What
the backend does with a hit is what these tests check; what the judge accepts is tested with the judge."""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernel_cache.record import KernelRecord
from kernel_cache.store import KernelStore
from ks_inductor.compiler import backend as B
from ks_inductor.compiler.explain import explain
from ks_inductor.judge import plan as PL
from ks_inductor.signature import spec_signature
from ks_inductor.source_module import load_source_module


def norm_key(model, x, db):
    """The norm region's key; ``x`` is the input, or a tuple of the inputs."""
    result = explain(model, *(x if isinstance(x, tuple) else (x,)), db=db)
    (norm,) = [r for r in result.regions if r.kind == "norm"]
    return norm.key, result


def problem_inputs(problem) -> list[torch.Tensor]:
    """Inputs at ``problem``'s signature, as the judge draws them."""
    from integrations.signature import random_inputs

    sig = spec_signature(problem.input_specs)
    assert sig is not None, problem.input_specs
    return random_inputs(sig, torch.device("cpu"))


def region_inputs(result, key) -> list[torch.Tensor]:
    """Inputs at the signature of the region ``key`` of an ``explain`` result."""
    [problem] = [p for p in result.problems if p.key == key]
    return problem_inputs(problem)


def recorded_plan(source: str, inputs: Sequence[torch.Tensor]) -> str:
    """The launch plan of one call of ``source``'s forward on ``inputs``, recorded as the judge records it (the
    kernels' launches, not run)."""
    module = load_source_module(source, "ks_test_kernel", tempfile.gettempdir())
    plan, payload, computed = PL.record(module.ModelNew(), list(inputs), [], PL.kernel_lookup(module), launch=False)
    assert not computed and not payload, (computed, list(payload))
    return plan.to_json()


def add_kernel(db, key, source, inputs: Sequence[torch.Tensor] | None = None, **kw):
    """Store ``source`` for ``key`` as verified on this machine; with ``inputs``, with the plan its forward records
    there (``plan=`` gives one outright)."""
    if inputs is not None and "plan" not in kw:
        kw["plan"] = recorded_plan(source, inputs)
    store = KernelStore(db)
    try:
        fp = B.current_fingerprint()
        return store.add_kernel(KernelRecord(problem_key=key, source=source, backend="triton-interpret",
                                             fingerprint=fp.to_json(), timed=kw.pop("timed", False), **kw))
    finally:
        store.close()


def store_region_kernels(model, inputs, db, source: Callable[[Any], str]) -> list[Any]:
    """One kernel per region of ``model`` at ``inputs``, ``source(problem)``, stored untimed as the interpreter judge
    would, each with its recorded plan; the regions' problems."""
    problems = explain(model, *inputs, db=db).problems
    for p in problems:
        with KernelStore(db) as store:
            store.upsert_problem(p)
        add_kernel(db, p.key, source(p), problem_inputs(p))
    return problems


def norm_kernel_module(repeats: int = 1, fails: bool = False, plus: bool = False, residual: bool = False) -> str:
    """A Triton RMSNorm over the last dimension, as a cached-kernel module for a norm region taking ``(x, w)`` and
    returning the norm. ``plus``: it takes ``(x, w, a)`` and returns the norm plus ``a``, a row; ``residual``: it
    takes ``(x, r, w)``, normalizes ``x + r`` and returns ``(x + r, norm)``. ``repeats``: the norm computed that many
    times over (a correct kernel, slow on purpose); ``fails``: every launch raises, as a device fault would."""
    inputs = "x, w, a" if plus else "x, r, w" if residual else "x, w"
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def _rmsnorm(x_ptr, r_ptr, w_ptr, a_ptr, out_ptr, sum_ptr, n, REPEATS: tl.constexpr, FAILS: tl.constexpr,
                     PLUS: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            cols = tl.arange(0, BLOCK)
            mask = cols < n
            tl.static_assert(not FAILS, "device lost")
            x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
            if RESIDUAL:
                x += tl.load(r_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(sum_ptr + row * n + cols, x.to(sum_ptr.dtype.element_ty), mask=mask)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = tl.zeros([BLOCK], dtype=tl.float32)
            for _ in range(REPEATS):
                y = x / tl.sqrt(tl.sum(x * x, axis=0) / n + 1e-6)
            y = y * w
            if PLUS:
                y += tl.load(a_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


        class ModelNew(nn.Module):
            def forward(self, {inputs}):
                n = x.shape[-1]
                out = torch.empty_like(x)
                total = torch.empty_like(x) if {residual} else out
                _rmsnorm[(x.numel() // n,)](x, {"r" if residual else "x"}, w, {"a" if plus else "w"}, out, total, n,
                                            REPEATS={repeats}, FAILS={fails}, PLUS={plus}, RESIDUAL={residual},
                                            BLOCK=triton.next_power_of_2(n))
                return {"(total, out)" if residual else "out"}
    """)
