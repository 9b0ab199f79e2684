"""A compiled Triton kernel launched from C++ by torch's static CUDA launcher, without Triton's Python launcher.

Triton's launcher is a Python call around its C launch (scratch allocation, hook and pointer checks): on the host of
an eagerly run model that is several microseconds of every served call, as much as the kernel itself takes at a
decode step. torch ships the launcher Inductor uses for its own Triton kernels (``torch._C._StaticCudaLauncher``):
it loads a compiled kernel's cubin, the binary Triton built, and launches it with the arguments given.

Only kernels that launcher runs exactly as Triton would are taken: a cubin, one CTA per cluster, no scratch memory,
no cooperative or programmatic-dependent launch, no tensor descriptors, and scalars of 32- and 64-bit integer and
float types (Triton passes narrower ones in layouts of its own). Everything else, and a torch without the launcher,
keeps Triton's. Whichever launches, a plan is checked against the kernel's forward before it serves
(:func:`integrations.launch_plan.make_plan`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any

import torch

# Triton's scalar types the static launcher passes as the cubin expects them, by its one-letter code.
_SCALARS = {"i32": "i", "u32": "I", "i64": "l", "u64": "K", "fp32": "f", "f32": "f", "fp64": "d"}


@dataclass(frozen=True)
class StaticKernel:
    """A cubin loaded for the static launcher: ``launch(function, gx, gy, gz, num_warps, shared, arg_types, args,
    stream)`` runs it with ``args`` the kernel's runtime arguments, which are those at positions ``keep`` of its
    parameters (Triton's binder hands over constexprs too, compiled in here), then ``extra``, the scratch
    arguments the kernel takes after its own (always null here)."""

    launch: Any
    function: int
    num_warps: int
    shared: int
    arg_types: str
    keep: tuple[int, ...]
    params: int
    extra: tuple[None, ...]


def _launcher() -> Any:
    if torch.version.hip is not None:
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


def _arg_types(kernel: Any) -> tuple[str, tuple[int, ...], int] | None:
    """The launcher's type codes for the kernel's runtime arguments, in order (constexprs are compiled in), their
    positions among its parameters and how many parameters it has; None where one is a type the launcher does not
    pass as Triton does."""
    src = kernel.src
    names = list(src.fn.arg_names)

    def index(key: Any) -> int:
        if isinstance(key, str):
            return names.index(key)
        return key[0] if isinstance(key, tuple) else key

    signature = {index(k): v for k, v in src.signature.items()}
    constants = {index(k) for k in getattr(src, "constants", {})}
    codes, keep = [], []
    for i in sorted(signature):
        ty = signature[i]
        if ty == "constexpr" or i in constants:
            continue
        if not isinstance(ty, str):
            return None
        code = "O" if ty.startswith("*") else _SCALARS.get(ty)
        if code is None:
            return None
        codes.append(code)
        keep.append(i)
    return "".join(codes), tuple(keep), len(names)


def _unload(launcher: Any, module: int) -> None:
    with contextlib.suppress(Exception):
        launcher._unload_kernel(module)


def static_kernel(kernel: Any, device_index: int) -> tuple[StaticKernel | None, str]:
    """``kernel`` (a Triton ``CompiledKernel``) loaded for torch's static launcher on device ``device_index``:
    (kernel, "") or (None, why it keeps Triton's launcher)."""
    meta = kernel.metadata
    asm = getattr(kernel, "asm", {}) or {}
    if "cubin" not in asm:
        return None, "no cubin"
    if getattr(meta, "num_ctas", 1) != 1 or tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) != (1, 1, 1):
        return None, "a kernel launched in clusters"
    if getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False):
        return None, "a cooperative or programmatic-dependent launch"
    if getattr(meta, "tensordesc_meta", None):
        return None, "tensor descriptor arguments"
    extra = []
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(meta, attr):
            if getattr(meta, attr):
                return None, "scratch memory"
            extra.append(None)  # the kernel still takes the (null) pointer
    try:
        described = _arg_types(kernel)
    except (AttributeError, ValueError, TypeError) as e:
        return None, f"its signature could not be read ({type(e).__name__})"
    if described is None:
        return None, "a scalar type the static launcher passes differently"
    types, keep, params = described
    launcher = _launcher()
    if launcher is None:
        return None, "this torch has no static CUDA launcher"
    shared = int(getattr(meta, "shared", 0))
    name = getattr(meta, "name", None) or kernel.src.fn.__name__
    fd, path = tempfile.mkstemp(suffix=".cubin", prefix="ks-plan-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(asm["cubin"])
        loaded = launcher._load_kernel(path, name, shared, device_index)
    except Exception as e:  # noqa: BLE001 - a kernel the launcher cannot load keeps Triton's
        return None, f"the static launcher did not load it ({type(e).__name__}: {e})"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    # torch returns (module, function, registers, spills), or without the module before it could unload one.
    if len(loaded) == 4:
        module, function = loaded[0], loaded[1]
    else:
        module, function = None, loaded[0]
    static = StaticKernel(launcher._launch_kernel, function, int(meta.num_warps), shared, types + "O" * len(extra),
                          keep, params, tuple(extra))
    if module is not None and hasattr(launcher, "_unload_kernel"):
        weakref.finalize(static, _unload, launcher, module)
    return static, ""
