"""kernelsmith: an evolutionary Triton kernel optimizer behind ``torch.compile(backend="kernelsmith")``.

Importing this package registers nothing: Dynamo finds the backend through the ``torch_dynamo_backends`` entry
point. :func:`register` is for environments without package metadata (a vendored source tree).
"""

from __future__ import annotations

from ks_core.version import __version__

__all__ = ["__version__", "explain", "register", "served"]


def register() -> None:
    """Register the backend by hand where entry points are unavailable; safe to call twice."""
    import torch._dynamo

    if "kernelsmith" in torch._dynamo.list_backends(exclude_tags=()):
        return
    from ks_inductor.compiler.backend import kernelsmith_backend

    torch._dynamo.register_backend(kernelsmith_backend, name="kernelsmith")


def __getattr__(name: str):
    # ks_inductor.explain(model, *inputs) without importing torch at package import time.
    if name == "explain":
        from ks_inductor.compiler.explain import explain

        return explain
    if name == "served":
        from ks_inductor.compiler.served import served

        return served
    raise AttributeError(name)
