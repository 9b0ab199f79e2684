"""Serving kernels from a pack in a Hugging Face ``transformers`` model.

``apply_kernelsmith(model)`` swaps the layers a verified pack covers: RMSNorm layers (``rmsnorm``), the gated
MLP's ``act_fn(gate) * up`` (``silu_mul``), and in attention layers the rotary embedding of queries and keys
(``rope``) and the attention itself (``attention``, where the model runs torch's ``sdpa``). Each swapped layer
runs our kernel only for the input signatures the kernel was verified for, after its golden vectors passed on the
device in use (for the attention's cache length, a free dim, each length is proven on its own first); every other
call runs the layer's own forward (``integrations.guard``).

How layers are swapped: by rebinding the ``forward`` of each instance (the convention of Liger-Kernel's
``_apply_liger_kernel_to_instance``), not through the Hugging Face ``kernels`` library that
``@use_kernel_forward_from_hub`` wires. That library is version-locked by transformers (5.24 accepts only
``kernels`` >= 0.18.2, < 0.19; with any other version the hooks are silent no-ops), and no such release is
installable where this was built; instance patching also covers the MLP, which transformers does not decorate,
touches only the model it is given, and is undone by ``remove_kernelsmith``.

The rotary embedding is a function of the model's file (``apply_rotary_pos_emb``) and the attention a function
of its registry (``ALL_ATTENTION_FUNCTIONS["sdpa"]``, through which transformers offers custom attention), both
looked up by name from the attention's forward, so each is swapped in two parts: the name is bound to a dispatcher
while any model served from this process uses it, and the dispatcher serves a kernel only inside the forward of
an attention layer that was swapped (a thread-local the layer's forward sets); every other caller gets
transformers' own function.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import guard as G
from .ops import (
    OP_ATTENTION,
    OP_RMSNORM,
    OP_ROPE,
    OP_SILU_MUL,
    Binding,
    PackBuild,
    attention_binding,
    key_function,
    layer_problem,
    pack_for_problems,
    rmsnorm_binding,
    rope_binding,
    silu_mul_binding,
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
# Attention layers whose forward applies ``apply_rotary_pos_emb(q, k, cos, sin)`` of their model file by name, then
# ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](self, q, k, v, attention_mask, dropout=..., scaling=...)``.
ATTENTION_CLASSES = frozenset({"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention",
                               "GraniteAttention", "Olmo2Attention"})
ROPE_FUNCTION = "apply_rotary_pos_emb"
ATTENTION_REGISTRY = "ALL_ATTENTION_FUNCTIONS"
ATTENTION_IMPLEMENTATION = "sdpa"
# Keyword arguments transformers' sdpa attention reads beyond q, k, v, the mask, dropout and scale: a call with
# any of them set is not the computation a key traced.
ATTENTION_READS = ("is_causal", "position_bias", "softcap", "output_attentions", "s_aux", "sinks")
_ORIGINAL = "_kernelsmith_original_forward"
# On a swapped attention layer: releases its use of the sites' dispatchers, when the layer is restored or
# collected (a model dropped without ``remove_kernelsmith`` leaves transformers' own functions bound again).
_RELEASE = "_kernelsmith_release"


@dataclass
class Report:
    swapped: list[str] = field(default_factory=list)  # module names whose forward now serves pack kernels
    ops: dict[str, list[str]] = field(default_factory=dict)  # module name -> the ops it serves
    skipped: dict[str, str] = field(default_factory=dict)  # covered module -> which of its ops are not served
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


# ============================================================================================ dispatchers


_ACTIVE = threading.local()  # .rope, .attention: what a dispatcher calls inside a swapped attention layer's forward


class _Site:
    """Where transformers looks a function up by name at each call: an attribute of a model file
    (``apply_rotary_pos_emb``) or an entry of an attention registry (``ALL_ATTENTION_FUNCTIONS["sdpa"]``)."""

    def __init__(self, holder: Any, name: str) -> None:
        self.holder, self.name = holder, name
        self.mapping = isinstance(holder, MutableMapping)

    def get(self) -> Any:
        if self.mapping:
            return self.holder[self.name] if self.name in self.holder else None
        return getattr(self.holder, self.name, None)

    def bind(self, value: Any) -> bool:
        """Put ``value`` there; returns whether the registry had its own entry for the name (else it fell through
        to transformers' global one, which ``restore`` leaves in place)."""
        # transformers' registries keep an instance's own entries apart from the global ones; a plain mapping holds
        # every entry itself
        local = getattr(self.holder, "_local_mapping", None)
        own = self.name in local if isinstance(local, dict) else True
        if self.mapping:
            self.holder[self.name] = value
        else:
            setattr(self.holder, self.name, value)
        return own

    def restore(self, original: Any, had_own: bool) -> None:
        if self.mapping and not had_own:
            del self.holder[self.name]
        elif self.mapping:
            self.holder[self.name] = original
        else:
            setattr(self.holder, self.name, original)


class _Dispatch:
    """Bound at a site while a served model or a layer-problem recording uses it: inside a swapped attention
    layer's forward, the handler that forward put in ``slot`` of a thread-local answers first (else the recorder);
    None from it runs the site's own function, as does every call outside such a forward."""

    def __init__(self, original: Any, slot: str) -> None:
        self.original, self.slot = original, slot
        self.users = 0
        self.had_own = False
        self.recorder: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handler = getattr(_ACTIVE, self.slot, None) or self.recorder
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not None:
                return out
        return self.original(*args, **kwargs)


_DISPATCH_LOCK = threading.Lock()


def _acquire(site: _Site, slot: str) -> _Dispatch:
    with _DISPATCH_LOCK:
        current = site.get()
        if not isinstance(current, _Dispatch):
            current = _Dispatch(current, slot)
            current.had_own = site.bind(current)
        current.users += 1
        return current


def _release(site: _Site) -> None:
    with _DISPATCH_LOCK:
        current = site.get()
        if isinstance(current, _Dispatch):
            current.users -= 1
            if current.users <= 0:
                site.restore(current.original, current.had_own)


def _release_all(sites: list[_Site]) -> None:
    for site in sites:
        _release(site)


def _model_file(module: torch.nn.Module) -> Any:
    return sys.modules.get(type(module).__module__)


def _rope_site(module: torch.nn.Module) -> _Site | None:
    """Where an attention layer finds the model file's ``apply_rotary_pos_emb``, where it applies that function."""
    if type(module).__name__ not in ATTENTION_CLASSES:
        return None
    file = _model_file(module)
    return _Site(file, ROPE_FUNCTION) if callable(getattr(file, ROPE_FUNCTION, None)) else None


def _attention_site(module: torch.nn.Module) -> _Site | None:
    """Where an attention layer finds its attention function: the model file's registry, at the layer's
    implementation, where that is ``sdpa`` (torch's attention, which a key can trace)."""
    if type(module).__name__ not in ATTENTION_CLASSES:
        return None
    config = getattr(module, "config", None)
    registry = getattr(_model_file(module), ATTENTION_REGISTRY, None)
    if getattr(config, "_attn_implementation", None) != ATTENTION_IMPLEMENTATION or \
            not isinstance(registry, MutableMapping):
        return None
    return _Site(registry, ATTENTION_IMPLEMENTATION)


def _own_function(site: _Site | None) -> Any:
    """The stack's own function at a site, under any dispatcher bound there."""
    fn = site.get() if site is not None else None
    if isinstance(fn, _Dispatch):
        return fn.original
    return fn if callable(fn) else None


def _plain_attention(module: Any, mask: Any, rest: tuple, dropout: Any, scaling: Any, kwargs: dict) -> bool:
    """Whether an attention function is called as the ``attention`` op was traced: no mask, no dropout, the
    layer's own scale, and nothing the function reads beyond that."""
    return (mask is None and not rest and not dropout and scaling == getattr(module, "scaling", None)
            and not any(kwargs.get(name) for name in ATTENTION_READS))


def _rope_handler(served: G.ServedOp) -> Any:
    def handle(q: Any, k: Any, cos: Any, sin: Any, *rest: Any, **kwargs: Any) -> Any:
        if rest or kwargs:
            served.guard.count_fallback(served.name, G.R_CALL)
            return None
        return served(q, k, cos, sin)

    return handle


def _attention_handler(served: G.ServedOp) -> Any:
    def handle(module: Any, q: Any, k: Any, v: Any, mask: Any = None, *rest: Any, dropout: Any = 0.0,
               scaling: Any = None, **kwargs: Any) -> Any:
        if not _plain_attention(module, mask, rest, dropout, scaling, kwargs):
            served.guard.count_fallback(served.name, G.R_CALL)
            return None
        out = served(q, k, v)
        return None if out is None else (out, None)

    return handle


# ============================================================================================ layers


def _bindings(module: torch.nn.Module) -> list[Binding]:
    rope, attention = _own_function(_rope_site(module)), _own_function(_attention_site(module))
    if rope is not None or attention is not None:
        return ([rope_binding(rope)] if rope is not None else []) + \
            ([attention_binding(module, attention)] if attention is not None else [])
    name = type(module).__name__
    if name.endswith("RMSNorm"):
        b = rmsnorm_binding(module)
        return [b] if b is not None else []
    if name in GATED_MLP_CLASSES and all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return [silu_mul_binding(module.act_fn)]
    return []


def covered_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, Binding]]:
    """The layers this integration can serve, with how each computes its ops (an attention layer: its rotary
    embedding and its attention, each a binding)."""
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


def _attention_forward(handlers: list[tuple[str, Any]], original: Any) -> Any:
    """The layer's own forward, with each handler in its thread-local slot while it runs (the dispatchers bound
    at the model file's rotary function and attention registry serve through them)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        outer = [(slot, getattr(_ACTIVE, slot, None)) for slot, _ in handlers]
        for slot, handler in handlers:
            setattr(_ACTIVE, slot, handler)
        try:
            return original(*args, **kwargs)
        finally:
            for slot, handler in outer:
                setattr(_ACTIVE, slot, handler)

    return forward


_ARITY = {OP_RMSNORM: 2, OP_SILU_MUL: 2, OP_ROPE: 4, OP_ATTENTION: 3}
_FORWARDS = {OP_RMSNORM: _norm_forward, OP_SILU_MUL: _mlp_forward}
# Ops served inside an attention layer's forward through a dispatcher: the site it is bound at, the thread-local
# slot it reads, and the handler that calls the served op.
_DISPATCHED = {OP_ROPE: (_rope_site, "rope", _rope_handler), OP_ATTENTION: (_attention_site, "attention",
                                                                           _attention_handler)}


def _own_path(binding: Binding, original: Any) -> Any:
    """What the layer runs for its op without us, for racing a kernel: a norm's forward as installed before the
    swap (its own weight; the race only times it). The MLP computes ``act_fn(gate) * up`` in its own forward,
    and an attention layer calls its rotary function and attention function: each is the binding's reference."""
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
            release = m.__dict__.pop(_RELEASE, None)
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
    layers: dict[str, tuple[torch.nn.Module, list[tuple[Binding, G.ServedOp]]]] = {}
    missing: dict[str, list[str]] = {}
    for name, module, binding in covered_layers(model):
        op = served.get((binding.op, binding.group))
        if op is None:
            op = guard.bind(binding.op, key_function(binding), binding.reference, arity=_ARITY[binding.op],
                            own=_own_path(binding, module.forward), free=binding.free)
            served[(binding.op, binding.group)] = op
        if not op:
            missing.setdefault(name, []).append(binding.op)
            continue
        layers.setdefault(name, (module, []))[1].append((binding, op))
    for name, ops in missing.items():
        report.skipped[name] = f"the pack has no kernel computing its {' or '.join(ops)}"
    for name, (module, ops) in layers.items():
        original = module.forward
        if ops[0][0].op in _FORWARDS:
            module.forward = _FORWARDS[ops[0][0].op](module, ops[0][1], original)
        else:
            sites, handlers = [], []
            for binding, op in ops:
                site_of, slot, handler_of = _DISPATCHED[binding.op]
                site = site_of(module)
                _acquire(site, slot)
                sites.append(site)
                handlers.append((slot, handler_of(op)))
            module.__dict__[_RELEASE] = weakref.finalize(module, _release_all, sites)
            module.forward = _attention_forward(handlers, original)
        module.__dict__[_ORIGINAL] = original
        report.swapped.append(name)
        report.ops[name] = [binding.op for binding, _ in ops]
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
    sites: list[_Site] = []
    attention_of: dict[int, Binding] = {}  # the attention binding of each layer, by id

    def record(binding: Binding, tensors: list[torch.Tensor]) -> None:
        sig = call_signature(tensors)
        if (binding.group, sig) not in found:
            found[(binding.group, sig)] = layer_problem(binding, tensors)

    def record_rope(binding: Binding) -> Any:
        def recorder(q: Any, k: Any, cos: Any, sin: Any, *rest: Any, **kwargs: Any) -> None:
            if not rest and not kwargs and all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
                record(binding, [q, k, cos, sin])

        return recorder

    def record_attention(module: Any, q: Any, k: Any, v: Any, mask: Any = None, *rest: Any, dropout: Any = 0.0,
                         scaling: Any = None, **kwargs: Any) -> None:
        binding = attention_of.get(id(module))
        if binding is not None and _plain_attention(module, mask, rest, dropout, scaling, kwargs) and \
                all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            record(binding, [q, k, v])

    for _name, module, binding in covered_layers(model):
        if binding.op in _DISPATCHED:
            site_of, slot, _ = _DISPATCHED[binding.op]
            site = site_of(module)
            if binding.op == OP_ATTENTION:
                attention_of[id(module)] = binding
            if not any(s.holder is site.holder and s.name == site.name for s in sites):
                sites.append(site)
                dispatch = _acquire(site, slot)
                dispatch.recorder = record_rope(binding) if binding.op == OP_ROPE else record_attention
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
        for site in sites:
            dispatch = site.get()
            if isinstance(dispatch, _Dispatch):
                dispatch.recorder = None
            _release(site)
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
                             vectors=vectors, min_speedup=min_speedup, stack=STACK)
