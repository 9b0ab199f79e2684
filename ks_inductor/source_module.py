"""Turning source text into an importable module backed by a real file.

Triton's JIT reads a kernel's source through ``inspect``, so kernels must live in a file on disk; ``exec`` of a
string works under the interpreter but fails on a GPU ("@jit functions should be defined in a Python file").
Files are named by the source's hash, so the same kernel loads from the same path (and Triton's own cache stays
warm) across processes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import types


def default_module_dir() -> str:
    from ks_core.settings import Settings

    return str(Settings.from_env().cache_home() / "modules")


def load_source_module(source: str, prefix: str = "ks_kernel", directory: str | None = None) -> types.ModuleType:
    """Write ``source`` to ``<directory>/<prefix>_<hash>.py`` (atomically) and import it under that name."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"{prefix}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    directory = directory or default_module_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name + ".py")
    # Rewrite a file whose content differs: whatever sits on disk, what runs is the source we were given.
    if not os.path.exists(path) or _read(path) != source:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load module from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
