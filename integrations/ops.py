"""Which serving layer computes which pack problem.

A pack holds problems (KernelBench-style reference sources with a canonical key) and the kernels verified for
them. A layer is matched to a problem by computing, not by name: its own computation, written as a function of its
activations and weights (``reference``), is traced at the problem's input signature with the same tracer and key
the backend and the optimizer use (``ks_inductor.problem_tracing.problem_from_callable``); equal keys mean the same aten
graph, so the kernel computes what the layer computes, for that signature only. Two layers that compute the same
thing with the same non-tensor settings (class, eps, activation) share one ``group`` and one key table.

Ops covered:

* ``rmsnorm``: an RMSNorm over the last dim with a weight: inputs (hidden_states, weight).
* ``silu_mul``: a gated MLP's ``act_fn(gate) * up``: inputs (gate, up).
* ``rope``: rotary position embedding of an attention's queries and keys, as the model's own
  ``apply_rotary_pos_emb(q, k, cos, sin)`` computes it: inputs (q, k, cos, sin), outputs (q_embed, k_embed).
* ``attention``: an attention layer's scaled dot-product attention without a mask, as the stack's own attention
  function computes it (causal where queries are several): inputs (q, k, v) with heads ahead of positions; output
  (batch, positions, heads, head dim). The keys' and values' length is a free dim: one kernel serves a decode
  step at every cache length, each length proven before it serves (``guard.PackGuard.bind``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .signature import FreeDims, call_signature, meta_inputs

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

OP_RMSNORM = "rmsnorm"
OP_SILU_MUL = "silu_mul"
OP_ROPE = "rope"
OP_ATTENTION = "attention"


@dataclass(frozen=True)
class Binding:
    """How one layer instance computes one op: ``reference(*inputs)`` is the layer's own computation of it,
    ``group`` is equal for layers whose references trace to the same graph at every signature; ``free``: the
    (input, dim) pairs along which one kernel may serve other sizes (``guard.PackGuard.bind``)."""

    op: str
    reference: Callable[..., torch.Tensor]
    group: tuple
    free: FreeDims = ()


def _settings(obj: Any) -> tuple:
    """An object's plain attributes (eps, flags): part of what its forward computes, so part of its group."""
    return tuple(sorted((k, v) for k, v in vars(obj).items()
                        if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))))


def rmsnorm_binding(layer: torch.nn.Module) -> Binding | None:
    """Any module with a 1-D ``weight`` whose forward takes the hidden states alone (LlamaRMSNorm and its many
    copies). Whether it really is the pack's RMSNorm is decided by the key, not here."""
    w = getattr(layer, "weight", None)
    if not isinstance(w, torch.nn.Parameter) or w.dim() != 1:
        return None
    forward = type(layer).forward

    def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # The class's forward with the weight as an input: an instance forward the integration installed is
        # bypassed, so the reference is always the stack's own code.
        with torch.nn.utils.stateless._reparametrize_module(layer, {"weight": weight}):
            return forward(layer, x)

    return Binding(OP_RMSNORM, reference, (type(layer), _settings(layer), tuple(w.shape), w.dtype))


def silu_mul_binding(act_fn: torch.nn.Module | Callable[..., Any]) -> Binding:
    """``act_fn(gate) * up`` as a gated MLP computes it (SiLU for Llama-style models; the key tells others apart)."""

    def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return act_fn(gate) * up

    settings = _settings(act_fn) if hasattr(act_fn, "__dict__") else ()
    return Binding(OP_SILU_MUL, reference, (type(act_fn), settings))


def rope_binding(apply_rotary: Callable[..., Any]) -> Binding:
    """A model's own ``apply_rotary_pos_emb(q, k, cos, sin)`` at its default ``unsqueeze_dim``: every model file
    carries its own copy of the function, so the function itself is the group (the key tells copies apart)."""

    def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        return apply_rotary(q, k, cos, sin)

    return Binding(OP_ROPE, reference, (getattr(apply_rotary, "__module__", ""),
                                        getattr(apply_rotary, "__qualname__", repr(apply_rotary))))


def attention_binding(layer: torch.nn.Module, function: Callable[..., Any]) -> Binding:
    """An attention layer's ``function(layer, q, k, v, None, dropout=0.0, scaling=layer.scaling)``: the attention
    its forward asks the stack's registry for, unmasked and without dropout, as an unpadded prefill or a decode
    step calls it. What the function reads of the layer (its key/value head groups, whether it is causal, its
    scale) is the group, with the function itself."""
    scaling = getattr(layer, "scaling", None)

    def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return function(layer, q, k, v, None, dropout=0.0, scaling=scaling)[0]

    group = (getattr(function, "__module__", ""), getattr(function, "__qualname__", repr(function)), scaling,
             getattr(layer, "num_key_value_groups", None), getattr(layer, "is_causal", None))
    return Binding(OP_ATTENTION, reference, group, free=((1, 2), (2, 2)))


def layer_problem(binding: Binding, inputs: list[torch.Tensor], name: str | None = None) -> Any:
    """The problem a binding computes at these inputs' signature (what a pack for this layer must hold)."""
    from ks_inductor.problem_tracing import problem_from_callable

    return problem_from_callable(binding.reference, meta_inputs(call_signature(inputs)), name=name or binding.op)


_KEYS: dict[tuple[tuple, tuple], str] = {}
_KEYS_LOCK = threading.Lock()


def key_function(binding: Binding) -> Callable[[tuple], str | None]:
    """``signature -> canonical key`` of the binding's reference, memoized per group and signature: every layer
    of a group shares one trace per signature."""
    from ks_inductor.problem_tracing import problem_from_callable

    def key_of(sig: tuple) -> str | None:
        memo = (binding.group, sig)
        with _KEYS_LOCK:
            key = _KEYS.get(memo)
        if key is None:
            key = problem_from_callable(binding.reference, meta_inputs(sig), name=binding.op).key
            with _KEYS_LOCK:
                _KEYS[memo] = key
        return key

    return key_of


# ============================================================================================ the pack a deployment needs

# What each stack runs for a layer where no pack kernel serves, and so what a pack's kernels must beat: transformers
# runs the model's own layers eagerly; LMDeploy its own kernels, which the search times beside eager and Inductor
# (``STACK_PEERS``); the others run their own kernels, often inside compiled or graphed code, for which eager and
# Inductor both stand.
STACK_BASELINES: dict[str, tuple[str, ...]] = {"transformers": ("eager",),
                                               "lmdeploy": ("eager", "inductor", "lmdeploy")}
# The factories of a stack's own kernels, by baseline name (``JudgeConfig.peers``).
STACK_PEERS: dict[str, dict[str, str]] = {"lmdeploy": {"lmdeploy": "kernelsmith_integrations.lmdeploy:own_kernel"}}


# Stacks that launch each call of a layer on its own, outside any CUDA graph: transformers' generate(). What decides
# there is a call's cost as made, host included (a pack's load-time race), not the device time inside a graph that
# a serving engine's decode captures (``EvolveConfig.in_graphs``).
STACKS_PER_CALL = frozenset({"transformers"})


def stack_in_graphs(stack: str) -> bool:
    return stack not in STACKS_PER_CALL


def stack_baselines(stack: str) -> tuple[str, ...]:
    return STACK_BASELINES.get(stack, ("eager", "inductor"))


def stack_peers(stack: str) -> dict[str, str]:
    return dict(STACK_PEERS.get(stack, {}))


@dataclass
class PackBuild:
    problems: list[Problem]
    warm: Any  # ks_inductor.warm.WarmSummary
    export: Any  # kernel_cache.pack.ExportResult | None (None when no problem got a kernel)
    missing: list[str]  # keys with no verified (or race) kernel for this machine

    def why_missing(self, key: str) -> str:
        """Why the problem ``key`` has no kernel in the pack, as its search said ("" where it has one)."""
        if key not in self.missing:
            return ""
        item = next((i for i in self.warm.items if i.key == key), None)
        return (item.note or item.status) if item is not None else "not searched"


def pack_for_problems(problems: list[Problem], path: str | os.PathLike[str], *, db: str | None = None,
                      config: Any = None, judge: Any = None, sign_key: str | os.PathLike[str] | None = None,
                      console: Any = None, vector_cap_bytes: int = 64 * 2**20, vectors: bool = True,
                      min_speedup: float | None = None, stack: str | None = None) -> PackBuild:
    """Warm the kernel cache (``db``) for the layer problems a deployment meets, then export exactly their
    verified kernels for this machine, with golden vectors, to the pack at ``path`` (nothing is written when
    none has a kernel). ``min_speedup`` leaves out kernels whose recorded speedup is lower. ``stack``: the serving
    stack the pack is for, whose settings replace the config's: what it runs where no kernel serves, which the
    search aims at (``stack_baselines``), the factories of its own kernels among them (``stack_peers``), and whether
    it runs the kernels inside CUDA graphs (``stack_in_graphs``)."""
    from dataclasses import replace

    from kernel_cache.access import open_store
    from kernel_cache.pack import ExportFilters, export_pack
    from kernel_cache.record import RACE
    from ks_inductor.compiler.backend import current_fingerprint
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import warm

    config = config if config is not None else EvolveConfig()
    if stack is not None:
        config = replace(config, baselines=stack_baselines(stack), peers=stack_peers(stack),
                         in_graphs=stack_in_graphs(stack))
    fp = judge.fingerprint if judge is not None else current_fingerprint(getattr(config, "backend", None))
    if config.settle_at is None and fp.timed:
        # A room is device time against the floor; a served call in a stack costs mostly the host's (what launch
        # plans cut), so a region near its floor on the device can still be served faster: none is settled, and
        # none has its time cut by its room, unless asked (--settle-at).
        config = replace(config, settle_at=math.inf)
    with open_store(db) as store:
        summary = warm(problems, store, config=config, judge=judge, console=console, origin="model-layers")
        # Verified kernels, and those a stack's race at load time decides (``record.RACE``).
        keys = [p.key for p in problems if store.lookup(p.key, fp) is not None
                or store.kernels(p.key, status=RACE, fingerprint_id=fp.id, limit=1)]
        missing = [p.key for p in problems if p.key not in keys]
        result = None
        if keys:
            result = export_pack(store, path, ExportFilters(keys=keys, fingerprint=fp.id, min_speedup=min_speedup),
                                 sign_key=sign_key, vectors=vectors, vector_cap_bytes=vector_cap_bytes)
    return PackBuild(problems, summary, result, missing)
