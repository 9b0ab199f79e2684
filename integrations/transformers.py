"""Serving kernels from a pack in a Hugging Face ``transformers`` model.

``apply_kernelsmith(model)`` swaps the layers a verified pack covers: RMSNorm layers (``rmsnorm``), the gated
MLP's ``act_fn(gate) * up`` (``silu_mul``) and the attention's rotary embedding of queries and keys (``rope``).
Each swapped layer runs our kernel only for the input signatures the
kernel was verified for, after its golden vectors passed on the device in use; every other call runs the layer's
own forward (``integrations.guard``).

How layers are swapped: by rebinding the ``forward`` of each instance (the convention of Liger-Kernel's
``_apply_liger_kernel_to_instance``), not through the Hugging Face ``kernels`` library that
``@use_kernel_forward_from_hub`` wires. That library is version-locked by transformers (5.24 accepts only
``kernels`` >= 0.18.2, < 0.19; with any other version the hooks are silent no-ops), and no such release is
installable where this was built; instance patching also covers the MLP, which transformers does not decorate,
touches only the model it is given, and is undone by ``remove_kernelsmith``.

The rotary embedding is a function of the model's file (``apply_rotary_pos_emb``), called by name from the
attention's forward, so it is swapped in two parts: that name is bound to a dispatcher while any model served from
this process uses it, and the dispatcher serves a kernel only inside the forward of an attention layer that was
swapped (a thread-local the layer's forward sets); every other caller gets the model file's own function.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import guard as G
from .ops import (
    OP_RMSNORM,
    OP_ROPE,
    OP_SILU_MUL,
    Binding,
    PackBuild,
    key_function,
    layer_problem,
    pack_for_problems,
    rmsnorm_binding,
    rope_binding,
    silu_mul_binding,
    stack_baselines,
)
from .signature import call_signature

log = logging.getLogger("kernelsmith.integrations")

STACK = "transformers"
# Versions whose RMSNorm and gated-MLP forwards were read: (lowest, below).
KNOWN_VERSIONS = ((4, 50), (6, 0))
# Gated MLPs whose forward is exactly ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: the patched forward
# computes that, so only classes known to compute it are patched.
GATED_MLP_CLASSES = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP",
                               "Olmo2MLP", "GraniteMLP"})
# Attention layers whose forward applies ``apply_rotary_pos_emb(q, k, cos, sin)`` of their model file by name.
ROPE_ATTENTION_CLASSES = frozenset({"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention",
                                    "GraniteAttention", "Olmo2Attention"})
ROPE_FUNCTION = "apply_rotary_pos_emb"
_ORIGINAL = "_kernelsmith_original_forward"
# On a swapped attention layer: releases its use of the model file's dispatcher, when the layer is restored or
# collected (a model dropped without ``remove_kernelsmith`` leaves the file's own function bound again).
_ROPE_RELEASE = "_kernelsmith_rope_release"


@dataclass
class Report:
    swapped: list[str] = field(default_factory=list)  # module names whose forward now serves pack kernels
    ops: dict[str, str] = field(default_factory=dict)  # module name -> op
    skipped: dict[str, str] = field(default_factory=dict)  # covered module -> why it was not swapped
    refused: str = ""  # why nothing was swapped at all
    guard: G.PackGuard | None = None

    def stats(self) -> dict[str, Any]:
        return self.guard.stats() if self.guard is not None else G.empty_stats()


def stack_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return str(getattr(transformers, "__version__", "")) or None


# ============================================================================================ the rotary dispatcher


_ACTIVE = threading.local()  # .rope: what the dispatcher calls inside a swapped attention layer's forward


class _RopeDispatch:
    """Bound to ``apply_rotary_pos_emb`` in a model file while a served model or a layer-problem recording uses
    it: ``handler(q, k, cos, sin)`` (the served op inside a swapped layer, or a recorder) answers first; None from
    it, or any other call form, runs the file's own function."""

    def __init__(self, file: Any, original: Any) -> None:
        self.file = file
        self.original = original
        self.users = 0
        self.recorder: Any = None

    def __call__(self, q: Any, k: Any, cos: Any, sin: Any, *rest: Any, **kwargs: Any) -> Any:
        handler = getattr(_ACTIVE, "rope", None) or self.recorder
        if handler is not None:
            if rest or kwargs:
                if isinstance(handler, G.ServedOp):
                    handler.guard.count_fallback(handler.name, G.R_CALL)
            else:
                out = handler(q, k, cos, sin)
                if out is not None:
                    return out
        return self.original(q, k, cos, sin, *rest, **kwargs)


_DISPATCH_LOCK = threading.Lock()


def _model_file(module: torch.nn.Module) -> Any:
    return sys.modules.get(type(module).__module__)


def _rope_function(module: torch.nn.Module) -> Any:
    """The model file's own ``apply_rotary_pos_emb`` an attention layer applies, or None."""
    if type(module).__name__ not in ROPE_ATTENTION_CLASSES:
        return None
    fn = getattr(_model_file(module), ROPE_FUNCTION, None)
    if isinstance(fn, _RopeDispatch):
        return fn.original
    return fn if callable(fn) else None


def _acquire_dispatch(file: Any) -> _RopeDispatch:
    with _DISPATCH_LOCK:
        current = getattr(file, ROPE_FUNCTION)
        if not isinstance(current, _RopeDispatch):
            current = _RopeDispatch(file, current)
            setattr(file, ROPE_FUNCTION, current)
        current.users += 1
        return current


def _release_dispatch(file: Any) -> None:
    with _DISPATCH_LOCK:
        current = getattr(file, ROPE_FUNCTION, None)
        if isinstance(current, _RopeDispatch):
            current.users -= 1
            if current.users <= 0:
                setattr(file, ROPE_FUNCTION, current.original)


# ============================================================================================ layers


def _bindings(module: torch.nn.Module) -> list[Binding]:
    rope = _rope_function(module)
    if rope is not None:
        return [rope_binding(rope)]
    name = type(module).__name__
    if name.endswith("RMSNorm"):
        b = rmsnorm_binding(module)
        return [b] if b is not None else []
    if name in GATED_MLP_CLASSES and all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return [silu_mul_binding(module.act_fn)]
    return []


def covered_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, Binding]]:
    """The layers this integration can serve, with how each computes its op."""
    return [(name, m, b) for name, m in model.named_modules() for b in _bindings(m)]


# ============================================================================================ swapping


def _norm_forward(module: torch.nn.Module, served: G.ServedOp, original: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs:
            out = served(args[0], module.weight)
            if out is not None:
                return out
        else:
            served.guard.count_fallback(served.name, G.R_CALL)
        return original(*args, **kwargs)

    return forward


def _mlp_forward(module: torch.nn.Module, served: G.ServedOp, original: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) != 1 or kwargs:
            served.guard.count_fallback(served.name, G.R_CALL)
            return original(*args, **kwargs)
        x = args[0]
        gate, up = module.gate_proj(x), module.up_proj(x)
        h = served(gate, up)
        if h is None:
            h = module.act_fn(gate) * up
        return module.down_proj(h)

    return forward


def _attention_forward(module: torch.nn.Module, served: G.ServedOp, original: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_ACTIVE, "rope", None)
        _ACTIVE.rope = served
        try:
            return original(*args, **kwargs)
        finally:
            _ACTIVE.rope = outer

    return forward


_ARITY = {OP_RMSNORM: 2, OP_SILU_MUL: 2, OP_ROPE: 4}
_FORWARDS = {OP_RMSNORM: _norm_forward, OP_SILU_MUL: _mlp_forward, OP_ROPE: _attention_forward}


def _own_path(binding: Binding, original: Any) -> Any:
    """What the layer runs for its op without us, for racing a kernel: a norm's forward as installed before the
    swap (its own weight; the race only times it). The MLP computes ``act_fn(gate) * up`` in its own forward,
    which is the binding's reference."""
    if binding.op == OP_RMSNORM:
        return lambda x, weight: original(x)
    return binding.reference


def remove_kernelsmith(model: torch.nn.Module) -> int:
    """Give every swapped layer its own forward back; returns how many were restored."""
    n = 0
    for m in model.modules():
        if _ORIGINAL in m.__dict__:
            m.__dict__.pop("forward", None)
            del m.__dict__[_ORIGINAL]
            release = m.__dict__.pop(_ROPE_RELEASE, None)
            if release is not None:
                release()
            n += 1
    return n


def apply_kernelsmith(model: torch.nn.Module, pack: str | os.PathLike[str] | None = None, db: str | None = None, *,
                      trust_keys: list[str] | None = None) -> Report:
    """Serve the kernels of ``pack`` (else ``KERNELSMITH_PACK``), or of the kernel cache ``db``, in ``model``.

    Never raises for a pack, a kernel or a version problem: the model keeps its own layers and ``report.refused``
    says why. Applying again replaces an earlier application."""
    report = Report()
    if G.disabled():
        report.refused = f"{G.ENV_DISABLE}=1"
        return report
    if not G.version_known(STACK, stack_version(), *KNOWN_VERSIONS):
        report.refused = f"transformers {stack_version()} is not a known version"
        return report
    remove_kernelsmith(model)
    guard, why = G.load_guard(STACK, pack, db=db, trust_keys=trust_keys)
    if guard is None:
        report.refused = why
        return report
    report.guard = guard
    served: dict[tuple, G.ServedOp] = {}
    for name, module, binding in covered_layers(model):
        original = module.forward
        op = served.get((binding.op, binding.group))
        if op is None:
            op = guard.bind(binding.op, key_function(binding), binding.reference, arity=_ARITY[binding.op],
                            own=_own_path(binding, original))
            served[(binding.op, binding.group)] = op
        if not op:
            report.skipped[name] = f"the pack has no kernel computing this {binding.op}"
            continue
        if binding.op == OP_ROPE:
            file = _model_file(module)
            _acquire_dispatch(file)
            module.__dict__[_ROPE_RELEASE] = weakref.finalize(module, _release_dispatch, file)
        module.__dict__[_ORIGINAL] = original
        module.forward = _FORWARDS[binding.op](module, op, original)
        report.swapped.append(name)
        report.ops[name] = binding.op
    if report.swapped:
        sigs = sorted({str([list(s[0]) for s in sig]) for op in served.values() for sig in op.signatures})
        log.info("kernelsmith: %d layers of %s serve pack %s kernels for %s", len(report.swapped),
                 type(model).__name__, guard.path, ", ".join(sigs))
    return report


# ============================================================================================ the pack a model needs


def layer_problems(model: torch.nn.Module, example_inputs: Sequence[Any]) -> list[Any]:
    """The problems ``model``'s covered layers compute at the signatures they meet when run on each of
    ``example_inputs`` (a tuple of positional arguments, a dict of keyword arguments, a tensor, or a function of
    the model that runs it as the deployment does: ``lambda m: m.generate(ids, max_new_tokens=2)`` meets the
    prefill and the decode step with the positions and caches generation makes)."""
    found: dict[tuple, Any] = {}
    handles = []
    files = []

    def record(binding: Binding, tensors: list[torch.Tensor]) -> None:
        sig = call_signature(tensors)
        if (binding.group, sig) not in found:
            found[(binding.group, sig)] = layer_problem(binding, tensors)

    for _name, module, binding in covered_layers(model):
        if binding.op == OP_ROPE:
            file = _model_file(module)
            if file not in files:
                files.append(file)
                dispatch = _acquire_dispatch(file)

                def recorder(q: Any, k: Any, cos: Any, sin: Any, b: Binding = binding) -> None:
                    if all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
                        record(b, [q, k, cos, sin])

                dispatch.recorder = recorder
            continue
        if binding.op == OP_RMSNORM:
            def hook(mod: Any, args: tuple, b: Binding = binding) -> None:
                if len(args) == 1 and isinstance(args[0], torch.Tensor):
                    record(b, [args[0], mod.weight])
        else:
            def hook(mod: Any, args: tuple, b: Binding = binding) -> None:
                if len(args) == 1 and isinstance(args[0], torch.Tensor):
                    record(b, [mod.gate_proj(args[0]), mod.up_proj(args[0])])
        handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for inp in example_inputs:
                if callable(inp) and not isinstance(inp, torch.Tensor):
                    inp(model)
                elif isinstance(inp, dict):
                    model(**inp)
                elif isinstance(inp, torch.Tensor):
                    model(inp)
                else:
                    model(*inp)
    finally:
        for h in handles:
            h.remove()
        for file in files:
            getattr(file, ROPE_FUNCTION).recorder = None
            _release_dispatch(file)
    return list(found.values())


def pack_for_model(model: torch.nn.Module, example_inputs: Sequence[Any], path: str | os.PathLike[str], *,
                   db: str | None = None, config: Any = None, judge: Any = None,
                   sign_key: str | os.PathLike[str] | None = None, console: Any = None,
                   vector_cap_bytes: int = 64 * 2**20, vectors: bool = True,
                   min_speedup: float | None = None) -> PackBuild:
    """Warm the kernel cache for the layers ``model`` runs at ``example_inputs`` and export exactly the pack a
    deployment of it needs (the layer problems ``apply_kernelsmith`` looks up, with golden vectors). The search
    aims at the model's own layers, which is what transformers runs where no kernel serves.

    The deployment's shapes are the ones to pass: a pack serves only the signatures it holds (for generation, the
    prefill lengths in use and the decode step at each batch size). Golden vectors are kept for problems up to
    ``vector_cap_bytes``; a kernel of a larger one is proven on the device against the layer's own computation."""
    return pack_for_problems(layer_problems(model, example_inputs), path, db=db, config=config, judge=judge,
                             sign_key=sign_key, console=console, vector_cap_bytes=vector_cap_bytes,
                             vectors=vectors, min_speedup=min_speedup, baselines=stack_baselines(STACK))
