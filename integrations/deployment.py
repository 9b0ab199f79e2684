"""The layer problems a serving deployment of a model meets: what ``kernelsmith pack export --hf-config MODEL``
warms and packs.

MODEL is a transformers model type (``llama``) or a config.json. For the ``transformers`` stack the model is built
with random weights (nothing downloaded) and run at each deployment shape (every batch size times every sequence
length: the prefill lengths and, for generation, 1 for the decode step); the RMSNorm and SiLU·mul problems its
layers meet are the answer (:func:`integrations.transformers.layer_problems`). For ``sglang``, ``vllm`` and
``lmdeploy`` only the config is read: the stack's ``RMSNorm`` (with and without the residual) and ``SiluAndMul``
at every token count ``batch * seq`` are the problems (each integration's ``layer_problems``: ``(tokens, hidden)``
activations, ``(1, tokens, hidden)`` for LMDeploy, whose engine packs a batch's tokens into one sequence; needs the
stack's Python part).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STACKS = ("transformers", "sglang", "vllm", "lmdeploy")
# Stacks whose layer problems come from the config alone: the module with their ``layer_problems``, and whether
# their activations carry a leading dimension of 1 (LMDeploy's engine packs a batch's tokens into one sequence).
_CONFIG_STACKS = {"sglang": ("sglang", False), "vllm": ("vllm", False), "lmdeploy": ("lmdeploy", True)}


class DeploymentError(Exception):
    """A model, config or stack that cannot be read as asked; the message says what to fix."""


def deployment_problems(model: str, stack: str = "transformers", overrides: dict[str, Any] | None = None,
                        batches: Sequence[int] = (1,), seqs: Sequence[int] = (16,), dtype: str | None = None,
                        device: str | None = None) -> list[Any]:
    """The problems the layers of a ``stack`` deployment of ``model`` compute at every ``batches`` times ``seqs``
    shape, in ``dtype`` (a torch dtype name; default bfloat16 on a GPU, float32 on a CPU) on ``device``."""
    import torch

    from ks_inductor.warm import WarmError, hf_model
    from ks_inductor.warm.sources import hf_inputs

    if stack not in STACKS:
        raise DeploymentError(f"unknown stack {stack!r}; choose one of {', '.join(STACKS)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _dtype(dtype, device)
    if stack == "transformers":
        from .transformers import layer_problems

        try:
            built, _ = hf_model(model, overrides or {}, batches[0], seqs[0], str(torch_dtype).removeprefix("torch."),
                                device)
        except WarmError as e:
            raise DeploymentError(str(e)) from None
        return layer_problems(built, hf_inputs(built, batches, seqs))
    return _config_problems(model, stack, overrides or {}, torch_dtype, batches, seqs)


def _dtype(name: str | None, device: str) -> Any:
    import torch

    if name is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    dt = getattr(torch, aliases.get(name, name), None)
    if not isinstance(dt, torch.dtype):
        raise DeploymentError(f"dtype {name!r}: not a torch dtype (bf16, fp16, fp32, bfloat16, ...)")
    return dt


def _hf_config(model: str, overrides: dict[str, Any]) -> Any:
    try:
        import transformers
    except ImportError:
        raise DeploymentError(f"reading the config of {model!r} needs `transformers` (pip install transformers)") \
            from None
    path = Path(model)
    try:
        if path.is_file():
            return transformers.AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json"
                                                           else str(path), **overrides)
        return transformers.AutoConfig.for_model(model, **overrides)
    except Exception as e:  # noqa: BLE001 - whatever transformers says about the name or the file
        raise DeploymentError(f"cannot build a transformers config from {model!r}: {e}") from None


def _config_problems(model: str, stack: str, overrides: dict[str, Any], dtype: Any, batches: Sequence[int],
                     seqs: Sequence[int]) -> list[Any]:
    """A stack's RMSNorm (with and without the residual) and SiluAndMul at every token count a deployment runs,
    from the model's config: these stacks run ``(tokens, hidden)`` activations, whatever the batch."""
    module, packed = _CONFIG_STACKS[stack]
    try:
        layer_problems = importlib.import_module(f"{__package__}.{module}").layer_problems
    except ImportError as e:
        raise DeploymentError(f"the {stack} stack needs {stack}'s Python part: {e}") from None
    cfg = _hf_config(model, overrides)
    missing = [k for k in ("hidden_size", "intermediate_size") if not getattr(cfg, k, None)]
    if missing:
        raise DeploymentError(f"the config of {model!r} has no {missing[0]}: not a gated-MLP decoder")
    hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
    eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
    lead = (1,) if packed else ()
    tokens = sorted({b * s for b in batches for s in seqs})
    norms = [((*lead, t, hidden), dtype, eps) for t in tokens]
    try:
        return layer_problems(norms, [((*lead, t, 2 * inter), dtype) for t in tokens], norms)
    except ImportError as e:
        raise DeploymentError(f"the {stack} stack needs {stack}'s Python part: {e}") from None
