"""Kernels put in a cache by hand for the backend's tests: a model's norm region's key, a kernel stored for it as
verified on this machine, and a kernel module whose forward runs what a test asks."""

from __future__ import annotations

import textwrap

from kernel_cache.record import KernelRecord
from kernel_cache.store import KernelStore
from ks_inductor.compiler import backend as B
from ks_inductor.compiler.explain import explain


def norm_key(model, x, db):
    """The norm region's key; ``x`` is the input, or a tuple of the inputs."""
    result = explain(model, *(x if isinstance(x, tuple) else (x,)), db=db)
    (norm,) = [r for r in result.regions if r.kind == "norm"]
    return norm.key, result


def add_kernel(db, key, source, **kw):
    store = KernelStore(db)
    try:
        fp = B.current_fingerprint()
        return store.add_kernel(KernelRecord(problem_key=key, source=source, backend="triton-interpret",
                                             fingerprint=fp.to_json(), timed=kw.pop("timed", False), **kw))
    finally:
        store.close()


def kernel_module(forward_body: str) -> str:
    """A cached-kernel module for the test norm region: ``ModelNew.forward(x, w)`` runs ``forward_body``."""
    body = textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
    return textwrap.dedent("""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def _never(x_ptr):
            pass


        class ModelNew(nn.Module):
            def forward(self, x, w):
    """) + body + "\n"
