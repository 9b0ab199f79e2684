"""Where the problems to warm come from: a model factory (``module:function`` or ``file.py:function``), a
KernelBench file or folder, a Hugging Face config with random weights, or the misses a compile recorded.

The regions of a model come from the backend's own analysis (:func:`ks_inductor.compiler.explain.explain`), so
the keys warmed are exactly the keys the backend looks up.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ks_inductor.contracts import CompileStore, SearchStore

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

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

    from ks_core.problem_record import ProblemError, exec_problem_source

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
    if not path.is_file():
        known = list(transformers.CONFIG_MAPPING.keys())
        if config not in known:
            raise WarmError(f"--hf-config {config!r} is neither a config file nor a transformers model type"
                            f"{_closest(config, known)}")
    try:
        if path.is_file():
            source = str(path.parent) if path.name == "config.json" else str(path)
            check_config_keys(transformers.AutoConfig.from_pretrained(source), overrides or {})
            cfg = transformers.AutoConfig.from_pretrained(source, **(overrides or {}))
        else:
            check_config_keys(transformers.AutoConfig.for_model(config), overrides or {})
            cfg = transformers.AutoConfig.for_model(config, **(overrides or {}))
    except WarmError:
        raise
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"cannot build a transformers config from {config!r}: {e}") from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _torch_dtype(dtype) if dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    check_fits(config, cfg, torch_dtype, device)
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as e:  # noqa: BLE001
        raise WarmError(f"transformers cannot build a causal LM for {config!r}: {e}") from None
    model = model.to(device=device, dtype=torch_dtype).eval()
    ids = torch.randint(0, int(getattr(cfg, "vocab_size", 1000)), (batch, seq), device=device)
    return model, (ids,)


def _closest(name: str, choices: Iterable[str]) -> str:
    """``; closest: a, b, c`` for the few choices nearest ``name``, or nothing when none is near."""
    near = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    return f"; closest: {', '.join(near)}" if near else ""


# Taken by a transformers config's constructor from its keyword arguments and kept under a private name.
_POPPED_CONFIG_KEYS = {"attn_implementation", "experts_implementation"}


def config_keys(cfg: Any) -> set[str]:
    """The fields a transformers config takes: its own, their aliases, its constructor's arguments and the fields
    of its dict-valued entries (``rope_theta`` lives in ``rope_parameters``)."""
    import inspect

    data = cfg.to_dict()
    keys = set(data) | set(getattr(cfg, "attribute_map", {}) or {})
    for cls in type(cfg).__mro__:  # the base config's constructor takes fields of its own
        init = vars(cls).get("__init__")
        if init is not None:
            keys |= {n for n in inspect.signature(init).parameters if n not in ("self", "args", "kwargs")}
    for name, value in data.items():
        if isinstance(value, dict) and name not in ("id2label", "label2id"):
            keys |= {k for k in value if isinstance(k, str)}
    # Properties are looked up on the class, not read: reading a deprecated one logs a warning.
    keys |= {n for n in dir(type(cfg)) if not n.startswith("_") and isinstance(getattr(type(cfg), n), property)}
    keys |= {n for n in vars(cfg) if not n.startswith("_")}
    return keys | _POPPED_CONFIG_KEYS


def check_config_keys(cfg: Any, overrides: dict[str, Any]) -> None:
    """Refuse an override the config has no field for: transformers would keep it as an unused attribute, and the
    model would be built from the defaults the user meant to change."""
    known = config_keys(cfg)
    for key in overrides:
        if key not in known:
            raise WarmError(f"--hf-set {key}: {getattr(cfg, 'model_type', 'the')} config has no field {key!r}"
                            f"{_closest(key, known)}")


def hf_inputs(model: Any, batches: Sequence[int], seqs: Sequence[int]) -> list[tuple]:
    """Example input ids for ``model`` (from :func:`hf_model`) at every batch size times every sequence length,
    drawn under a fixed seed: the shapes a deployment serves (each prefill length, and 1 for a decode step)."""
    import torch

    vocab = int(getattr(model.config, "vocab_size", 1000))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, vocab, (b, s), generator=gen).to(device),) for b in batches for s in seqs]


def param_counts(cfg: Any) -> tuple[int, int, int] | None:
    """A decoder built from a transformers config, from its sizes alone: (parameters outside the layers, parameters
    per layer, layers), counting embeddings, attention with grouped key/value heads, a gated MLP and the norms; None
    when the config does not say its hidden size, layers and vocabulary. An estimate for refusing what cannot fit,
    not an exact count."""
    hidden, layers, vocab = (getattr(cfg, k, None) for k in ("hidden_size", "num_hidden_layers", "vocab_size"))
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, vocab)):
        return None
    inter = getattr(cfg, "intermediate_size", None) or 4 * hidden
    heads = getattr(cfg, "num_attention_heads", None) or 1
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    outside = vocab * hidden * (1 if getattr(cfg, "tie_word_embeddings", False) else 2) + hidden
    return outside, attention + 3 * hidden * inter + 2 * hidden, layers


def available_memory(device: str) -> int | None:
    """Bytes a new model can still take on ``device``: the host's available memory (within its cgroup's limit) for
    the CPU, the free memory of the current GPU for CUDA; None where it cannot be told."""
    if device.startswith("cuda"):
        import torch

        try:
            return int(torch.cuda.mem_get_info()[0])
        except Exception:  # noqa: BLE001 - no way to ask: no check
            return None
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            found += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        with open("/sys/fs/cgroup/memory.current") as fh:
            used = int(fh.read().strip())
        if limit != "max":
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


# A model is refused when building it would take more than this share of what is available: the run that follows
# (tracing, Inductor's code generation, judge workers) needs memory of its own.
FIT_SHARE = 0.6


def check_fits(name: str, cfg: Any, dtype: Any, device: str) -> None:
    """Refuse (a WarmError) a model from ``cfg`` that would not fit, before anything is allocated: transformers
    builds it in float32 on the host, then it is cast to ``dtype`` on ``device``. The message says what fits."""
    import torch

    counts = param_counts(cfg)
    if counts is None:
        return
    outside, per_layer, layers = counts
    params = outside + per_layer * layers
    size = torch.empty((), dtype=dtype).element_size()
    # Bytes per parameter on each device: the float32 build on the host (and the cast copy when it stays there).
    per_param = {"cpu": 4 + (size if device == "cpu" and size != 4 else 0)}
    if device != "cpu":
        per_param[device] = size
    for where, each in per_param.items():
        avail = available_memory(where)
        if avail is None or params * each <= FIT_SHARE * avail:
            continue
        fits = int(FIT_SHARE * avail / each)
        most_layers = (fits - outside) // per_layer
        hint = (f"--hf-set num_hidden_layers={most_layers}" if most_layers >= 1 else
                "smaller hidden_size, intermediate_size and vocab_size with --hf-set")
        raise WarmError(f"{name}: about {params / 1e9:.2f}B parameters, {params * each / 2**30:.1f} GiB to build on "
                        f"the {where}, where {avail / 2**30:.1f} GiB is available; about {fits / 1e6:.0f}M "
                        f"parameters fit: try {hint}")


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
                        judge_backend: str | None = None, store: CompileStore | None = None) -> list[Problem]:
    """The distinct problems of the model's regions, looked up in ``store`` (one the caller has open, so that the
    database is not opened twice), else in the cache ``db`` names."""
    from ks_inductor.compiler.explain import explain

    return explain(model, *inputs, db=db, judge_backend=judge_backend, store=store).problems


# The KernelBench levels taken from a checkout when none are named; level 4's models download weights.
KERNELBENCH_LEVELS = (1, 2, 3)


def kernelbench_files(root: str | Path, levels: Sequence[int] | None = None,
                      ids: Sequence[int] | None = None) -> list[Path]:
    """The problem files under ``root``: a KernelBench checkout, or its ``KernelBench/`` folder (``levels`` of
    them, default :data:`KERNELBENCH_LEVELS`), or any folder of problem files (every ``*.py`` in it, ``levels``
    then meaning nothing); ``ids`` keeps the files whose name starts with one of those numbers."""
    import re

    root = Path(root)
    if not root.is_dir():
        raise WarmError(f"KernelBench folder not found: {root}")
    base = next((c for c in (root / "KernelBench", root) if any((c / f"level{n}").is_dir() for n in range(1, 5))),
                None)
    if base is None:
        if levels:
            raise WarmError(f"{root} has no level1/ ... level4/ folders to take levels {list(levels)} from")
        files = sorted(f for f in root.rglob("*.py") if not f.name.startswith("_"))
    else:
        files = []
        for level in levels or KERNELBENCH_LEVELS:
            folder = base / f"level{level}"
            if not folder.is_dir():
                if not levels:
                    continue  # the default levels are those of them the checkout has
                raise WarmError(f"{folder}: no such level folder")
            files += sorted(f for f in folder.glob("*.py") if not f.name.startswith("_"))
    if ids:
        wanted = set(ids)
        files = [f for f in files if (m := re.match(r"(\d+)_", f.name)) and int(m.group(1)) in wanted]
    if not files:
        raise WarmError(f"no KernelBench problem files in {root}" + (f" with ids {sorted(set(ids))}" if ids else ""))
    return files


def problems_from_folder(folder: str | Path, db: str | None = None, judge_backend: str | None = None,
                         levels: Sequence[int] | None = None, ids: Sequence[int] | None = None,
                         store: CompileStore | None = None) -> list[Problem]:
    """The regions of every KernelBench file's model in ``folder`` (:func:`kernelbench_files`: a checkout, its
    levels, or a folder of problem files): what ``torch.compile(backend="kernelsmith")`` of those models looks up
    (the whole file is a different key from the regions a compile cuts)."""
    from ks_core.problem_record import ProblemError

    problems = []
    for f in kernelbench_files(folder, levels, ids):
        try:
            model, inputs = kernelbench_model(f)
            problems.extend(problems_from_model(model, inputs, db=db, judge_backend=judge_backend, store=store))
        except (WarmError, ProblemError) as e:
            log.warning("skipping %s: %s", f, e)
    if not problems:
        raise WarmError(f"no KernelBench problem in {folder} could be traced")
    return problems


def problems_from_misses(store: SearchStore) -> list[Problem]:
    from ks_core.problem_record import Problem

    out = []
    for m in store.misses():
        data = m.get("problem")
        if data:
            out.append(Problem.from_json(data))
    return out
