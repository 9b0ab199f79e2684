"""Where the problems to warm come from: a model factory (``module:function`` or ``file.py:function``), a
KernelBench file or folder, a Hugging Face config with random weights, or the misses a compile recorded.

The regions of a model come from the backend's own analysis (:func:`ks_inductor.compiler.explain.explain`), so
the keys warmed are exactly the keys the backend looks up.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class WarmError(Exception):
    """Bad warm-up input (a factory that cannot be imported, a missing config); the message says what to fix."""


def load_factory(spec: str) -> tuple[Any, tuple]:
    """``module:function``, ``path/to/file.py:function`` or a KernelBench file ``path/to/problem.py`` (its
    ``Model(*get_init_inputs())`` and ``get_inputs()``, on the GPU where there is one) → (model, example inputs)."""
    if ":" not in spec and spec.endswith(".py"):
        return kernelbench_model(spec)
    if ":" not in spec:
        raise WarmError(f"{spec!r}: expected module:function, path/to/file.py:function or a KernelBench file")
    target, func_name = spec.rsplit(":", 1)
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target)
            if not path.is_file():
                raise WarmError(f"factory file not found: {path}")
            mod_name = f"ks_factory_{path.stem}"
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise WarmError(f"cannot import {path}")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except WarmError:
        raise
    except Exception as e:  # noqa: BLE001 - user code
        raise WarmError(f"importing {target} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise WarmError(f"{target} has no callable {func_name!r}")
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - user code; its message is what the user needs
        raise WarmError(f"{spec} raised {type(e).__name__}: {e}") from None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise WarmError(f"{spec} must return (model, example_inputs); got {type(out).__name__}")
    model, inputs = out
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs)


def kernelbench_model(path: str | Path, device: str | None = None) -> tuple[Any, tuple]:
    """A KernelBench file as the model a user would compile: ``Model(*get_init_inputs())`` on ``device`` (the GPU
    where there is one), with ``get_inputs()`` there too, both made under seed 0."""
    import torch

    from ks_inductor.problem import ProblemError, exec_problem_source

    p = Path(path)
    if not p.is_file():
        raise WarmError(f"KernelBench file not found: {p}")
    try:
        mod = exec_problem_source(p.read_text(), str(p))
    except ProblemError as e:
        raise WarmError(str(e)) from None
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(dev)
        inputs = tuple(x.to(dev) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs())
    except Exception as e:  # noqa: BLE001 - user code
        raise WarmError(f"{p}: building Model or its inputs failed: {type(e).__name__}: {e}") from None
    return model, inputs


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` strings → dict, values parsed as JSON where they parse (``hidden_size=64``)."""
    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise WarmError(f"override {p!r}: expected key=value")
        k, v = p.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def hf_model(config: str, overrides: dict[str, Any] | None = None, batch: int = 1, seq: int = 16,
             dtype: str | None = None, device: str | None = None) -> tuple[Any, tuple]:
    """A transformers causal LM with random weights from a config file or a model type (nothing downloaded)."""
    try:
        import transformers
    except ImportError:
        raise WarmError("warming from a Hugging Face config needs `transformers` (pip install transformers)") from None
    import torch

    path = Path(config)
    try:
        if path.is_file():
            cfg = transformers.AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json"
                                                          else str(path), **(overrides or {}))
        else:
            cfg = transformers.AutoConfig.for_model(config, **(overrides or {}))
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"cannot build a transformers config from {config!r}: {e}") from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _torch_dtype(dtype) if dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"transformers cannot build a causal LM for {config!r}: {e}") from None
    model = model.to(device=device, dtype=torch_dtype).eval()
    ids = torch.randint(0, int(getattr(cfg, "vocab_size", 1000)), (batch, seq), device=device)
    return model, (ids,)


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def _torch_dtype(name: str) -> Any:
    """``bf16``, ``bfloat16``, ``torch.bfloat16``, ... → the torch dtype; a name torch has no dtype for is a
    WarmError."""
    import torch

    key = name.strip().lower().removeprefix("torch.")
    dtype = getattr(torch, _DTYPE_ALIASES.get(key, key), None)
    if not isinstance(dtype, torch.dtype):
        raise WarmError(f"unknown dtype {name!r}: use bf16, fp16, fp32 or a torch dtype name such as bfloat16")
    return dtype


def problems_from_model(model: Any, inputs: Sequence[Any], db: str | None = None,
                        judge_backend: str | None = None) -> list[Any]:
    from ks_inductor.compiler.explain import explain

    return explain(model, *inputs, db=db, judge_backend=judge_backend).problems


def problems_from_folder(folder: str | Path, db: str | None = None, judge_backend: str | None = None) -> list[Any]:
    """The regions of every KernelBench file's model in ``folder``: what ``torch.compile(backend="kernelsmith")``
    of those models looks up (the whole file is a different key from the regions a compile cuts)."""
    from ks_inductor.problem import ProblemError

    root = Path(folder)
    if not root.is_dir():
        raise WarmError(f"KernelBench folder not found: {root}")
    problems = []
    for f in sorted(root.rglob("*.py")):
        if f.name.startswith("_"):
            continue
        try:
            model, inputs = kernelbench_model(f)
            problems.extend(problems_from_model(model, inputs, db=db, judge_backend=judge_backend))
        except (WarmError, ProblemError) as e:
            log.warning("skipping %s: %s", f, e)
    if not problems:
        raise WarmError(f"no KernelBench problem files in {root}")
    return problems


def problems_from_misses(store: Any) -> list[Any]:
    from ks_inductor.problem import Problem

    out = []
    for m in store.misses():
        data = m.get("problem")
        if data:
            out.append(Problem.from_json(data))
    return out
