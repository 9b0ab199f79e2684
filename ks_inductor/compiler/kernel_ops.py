"""A verified cached kernel as a ``torch.library`` op the compiled graph can call.

An op runs a kernel's judged plan (``ks_inductor.judged_plan``): the launches the judge's trusted side executed for
its verdict, of Triton kernels built from the candidate's source with everything but the kernels (and the literal
constants they read) left out. Nothing else of the candidate's Python (its module's top level, ``ModelNew``, its
forward) is imported in the user's process for a compiled graph (:func:`served_kernel`). :func:`load_kernel`
imports the whole module, for what needs its forward: serving's recording of a plan at a signature the kernel was
not judged at (``integrations.checks.plan_at``). A module is loaded from a file (Triton reads kernel source through
``inspect``, so an exec'd string would not do).

Two registrations:

* ``custom_op`` (CPU and the Triton interpreter, and the GPU fallback): an opaque op that runs the kernel's judged
  plan, and the region's reference where the plan declines a call (an input that starts past its storage's first
  byte). Its fake implementation runs the region's reference graph on fake tensors, so output shapes are right for
  symbolic sizes too, and its outputs are fresh contiguous tensors. If the kernel raises at run time the op warns
  once and computes the region with the reference instead: a model never breaks on a kernel.
* ``triton_op`` (GPU): the kernel's judged plan, traced with its kernels wrapped by ``wrap_triton``
  (``JudgedPlan.traced``), so AOTAutograd decomposes the op into ``triton_kernel_wrapper_functional`` nodes and
  Inductor emits the kernels in its own wrapper (no Python dispatch per call, part of Inductor's cache key). The
  forward is never traced: what a forward does under a tracer is nothing the judge saw. ``triton_op`` does not work
  under ``TRITON_INTERPRET=1`` (research note C §3.3), so it is only offered on CUDA.

A region where the judge measured eager's ops faster than Inductor's code gets a third kind (:func:`register_eager_op`):
an opaque op that runs the region's own graph as eager would, so that Inductor leaves it alone.

All get ``register_autograd`` with the backward of the reference region (``torch.func.vjp``): AOTAutograd traces
it into the backward graph that Inductor compiles, so gradients are those of eager.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kernel_cache.record import KernelRecord, source_sha256
from ks_inductor.judge.plan import state_tensors
from ks_inductor.source_module import load_source_module

if TYPE_CHECKING:
    from ks_inductor.judged_plan import JudgedPlan

log = logging.getLogger(__name__)

OP_NAMESPACE = "kernelsmith"


class KernelLoadError(Exception):
    """A cached kernel that cannot be turned into an op; the backend falls back to Inductor for its region."""


@dataclass
class ServedKernel:
    """A cached kernel as a compiled graph's op holds it: its record, and whether it failed at run time (then the
    region's reference computes every later call)."""

    record: KernelRecord
    disabled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class LoadedKernel(ServedKernel):
    """A kernel with its module imported and its ``ModelNew`` built: what recording its launches at a signature it
    was not judged at needs (``integrations.checks.plan_at``). A compiled graph never loads one."""

    module: types.ModuleType | None = None
    model: torch.nn.Module | None = None


_SERVED: dict[str, ServedKernel] = {}
_LOADED: dict[str, LoadedKernel] = {}
_OPS: dict[str, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def _kernel_dir() -> Path:
    """Where served kernels' modules are written (Triton reads a kernel's source from its file): in kernelsmith's
    home, beside the cache they come from, named by their source's hash so that Triton's cache stays warm across
    processes."""
    from ks_core.settings import Settings

    d = Settings.from_env().cache_home() / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def served_kernel(record: KernelRecord) -> ServedKernel:
    """The kernel a region's op runs, once per process per source: its record checked against its hash, nothing of
    its source imported (the op runs the judged plan, whose kernels ``JudgedPlan`` builds from the kernels alone)."""
    if source_sha256(record.source) != record.sha256:
        raise KernelLoadError(f"kernel {record.id}: source does not match its sha256; the cache entry is damaged")
    # One per source and plan: a plan that fails at run time stops its own op, not another plan's of that source.
    key = f"{record.sha256}|{hashlib.sha256(record.plan.encode()).hexdigest()}"
    with _REGISTRY_LOCK:
        return _SERVED.setdefault(key, ServedKernel(record))


def load_kernel(record: KernelRecord) -> LoadedKernel:
    """Import a cached kernel's source and build its ``ModelNew`` (regions have no constructor arguments)."""
    if source_sha256(record.source) != record.sha256:
        raise KernelLoadError(f"kernel {record.id}: source does not match its sha256; the cache entry is damaged")
    with _REGISTRY_LOCK:
        if record.sha256 in _LOADED:
            return _LOADED[record.sha256]
        try:
            module = load_source_module(record.source, "ks_kernel", str(_kernel_dir()))
        except Exception as e:  # noqa: BLE001 - any failure to import means: not this kernel
            raise KernelLoadError(f"kernel {record.id} failed to import: {type(e).__name__}: {e}") from None
        if not hasattr(module, "ModelNew"):
            raise KernelLoadError(f"kernel {record.id} defines no ModelNew")
        try:
            model = module.ModelNew()
        except Exception as e:  # noqa: BLE001
            raise KernelLoadError(f"kernel {record.id}: ModelNew() failed: {type(e).__name__}: {e}") from None
        if state_tensors(model):
            # A region's weights are its inputs; a kernel carrying its own state was made for another problem. A
            # tensor held as a plain attribute counts too: a plan that reads it is not stored, so the forward would
            # serve where the judged plan should.
            raise KernelLoadError(f"kernel {record.id}: ModelNew holds tensors of its own; not a region kernel")
        loaded = LoadedKernel(record, module=module, model=model)
        _LOADED[record.sha256] = loaded
        return loaded


# ----------------------------------------------------------------------------------------- op registration


@dataclass
class OpSpec:
    """What the op takes and returns: one entry per region input ("Tensor", "SymInt", "float", "bool")."""

    input_kinds: list[str]
    num_outputs: int
    output_dtypes: list[torch.dtype]

    def schema(self) -> str:
        args = ", ".join(f"{k} in{i}" for i, k in enumerate(self.input_kinds))
        ret = "Tensor" if self.num_outputs == 1 else "(" + ", ".join(["Tensor"] * self.num_outputs) + ")"
        return f"({args}) -> {ret}"


def input_kind(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return "Tensor"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, torch.SymInt)):
        return "SymInt"
    if isinstance(v, (float, torch.SymFloat)):
        return "float"
    raise KernelLoadError(f"region input of type {type(v).__name__} cannot cross a torch.library op")


def padded_by_inductor(values: Sequence[Any]) -> str:
    """Why Inductor may hand a traced kernel one of ``values`` (a region's inputs) in another layout than its own:
    a buffer Inductor lays out itself gets its larger strides padded to its alignment (``comprehensive_padding``),
    and a kernel that walks rows by their length would then read the padding. "" where no stride of theirs would
    be padded."""
    from torch._inductor import config

    if not config.comprehensive_padding:
        return ""
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.dim() < 2:
            continue
        align = max(1, config.padding_alignment_bytes // v.element_size())
        for n, stride in zip(v.shape, v.stride()):
            if n > 1 and type(stride) is int and stride > config.padding_stride_threshold and stride % align:
                return f"input {i}'s stride {stride} is one Inductor pads to a multiple of {align}"
    return ""


def op_name(record: KernelRecord, problem_key: str, spec: OpSpec, variant: str) -> str:
    h = hashlib.sha256(f"{record.sha256}|{problem_key}|{spec.schema()}|{variant}".encode()).hexdigest()[:20]
    return f"{OP_NAMESPACE}::r_{h}"


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _finish_outputs(outs: Sequence[Any], args: Sequence[Any], spec: OpSpec, check_alias: bool) -> Any:
    if len(outs) != spec.num_outputs:
        raise RuntimeError(f"kernel returned {len(outs)} outputs, the region has {spec.num_outputs}")
    done = []
    for o, dt in zip(outs, spec.output_dtypes):
        if not isinstance(o, torch.Tensor) or o.dtype != dt:
            raise RuntimeError(f"kernel output {type(o).__name__} {getattr(o, 'dtype', '')}, expected {dt}")
        if check_alias and any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr()
                               == o.untyped_storage().data_ptr() for a in args):
            o = o.clone()
        elif not check_alias and any(o is a for a in args):
            o = o.clone()
        done.append(o.contiguous())
    return done[0] if spec.num_outputs == 1 else tuple(done)


def register_region_op(
    kernel: ServedKernel,
    problem_key: str,
    reference: Callable[..., Any],
    spec: OpSpec,
    triton: bool = False,
    judged: JudgedPlan | None = None,
) -> Any:
    """Register (once per process) the op that runs ``kernel`` for a region; returns its OpOverload. ``judged``: the
    kernel's judged plan (``ks_inductor.judged_plan``), which a ``custom_op`` runs wherever it takes the call, and
    which a ``triton_op`` traces (for which ``untraceable`` found nothing at the region's example values). Without
    one there is no op: the kernel's forward, which no judge ran as it would run here, never stands in for it."""
    variant = "triton_op" if triton else "custom_op"
    if judged is None:
        raise KernelLoadError(f"kernel {kernel.record.id}: only its judged plan runs, and it has none")
    # What the op runs is the plan: a record of the same source with another is another op.
    variant += "|judged:" + hashlib.sha256(kernel.record.plan.encode()).hexdigest()[:16]
    name = op_name(kernel.record, problem_key, spec, variant)
    with _REGISTRY_LOCK:
        if name in _OPS:
            return _OPS[name]
        schema = spec.schema()
        if triton:
            op_def = _make_triton_op(name, schema, judged, spec)
        else:
            op_def = _make_custom_op(name, schema, kernel, reference, spec, judged)
        _register_autograd(op_def, reference, spec)
        ns, short = name.split("::")
        overload = getattr(getattr(torch.ops, ns), short).default
        _OPS[name] = overload
        log.debug("registered %s %s for kernel %s (%s)", variant, name, kernel.record.id, schema)
        return overload


_EAGER_SERIAL = itertools.count()


def register_eager_op(problem_key: str, reference: Callable[..., Any], spec: OpSpec) -> Any:
    """An opaque op that runs ``reference`` (a region of the user's graph) as eager does, for a region where the
    judge measured eager's ops faster than Inductor's code: Inductor calls it as it calls any extern op, and fuses
    nothing into it. One op per region module, since the module holds that graph's own submodules and weights."""
    name = (f"{OP_NAMESPACE}::e_{hashlib.sha256(f'{problem_key}|{spec.schema()}'.encode()).hexdigest()[:16]}_"
            f"{next(_EAGER_SERIAL)}")
    schema = spec.schema()

    def impl(*args: Any) -> Any:
        with torch.no_grad():
            return _finish_outputs(_as_tuple(reference(*args)), args, spec, check_alias=True)

    with _REGISTRY_LOCK:
        op_def = torch.library.custom_op(name, impl, mutates_args=(), schema=schema)
        op_def.register_fake(_fake_outputs(reference, spec))
        _register_autograd(op_def, reference, spec)
        ns, short = name.split("::")
        overload = getattr(getattr(torch.ops, ns), short).default
        _OPS[name] = overload
    log.debug("registered eager op %s for region %s (%s)", name, problem_key, schema)
    return overload


def _fake_outputs(reference: Callable[..., Any], spec: OpSpec) -> Callable[..., Any]:
    """The ops' fake implementation: the region's reference on fake tensors, so output shapes are right for symbolic
    sizes too; its outputs are fresh and contiguous, as the ops' real outputs are."""

    def fake(*args: Any) -> Any:
        outs = _as_tuple(reference(*args))
        fresh = [torch.empty_like(o, memory_format=torch.contiguous_format) for o in outs]
        return fresh[0] if spec.num_outputs == 1 else tuple(fresh)

    return fake


def _make_custom_op(name: str, schema: str, kernel: ServedKernel, reference: Callable[..., Any],
                    spec: OpSpec, judged: JudgedPlan) -> Any:
    def impl(*args: Any) -> Any:
        if not kernel.disabled:
            try:
                # Where the judged plan declines a call the reference computes it: the forward, which the judge
                # never ran, does not stand in for the plan.
                out = judged(*args)
                if out is not None:
                    return _finish_outputs(_as_tuple(out), args, spec, check_alias=True)
            except Exception as e:  # noqa: BLE001 - never a broken model: the reference computes the region
                with kernel.lock:
                    if not kernel.disabled:
                        kernel.disabled = True
                        warnings.warn(
                            f"kernelsmith: kernel {kernel.record.id} ({kernel.record.problem_key}) failed at run "
                            f"time ({type(e).__name__}: {e}); computing its region with the reference instead",
                            RuntimeWarning, stacklevel=2)
        with torch.no_grad():
            return _finish_outputs(_as_tuple(reference(*args)), args, spec, check_alias=True)

    op_def = torch.library.custom_op(name, impl, mutates_args=(), schema=schema)
    op_def.register_fake(_fake_outputs(reference, spec))
    return op_def


_ANNOTATIONS: dict[str, Any] = {"Tensor": torch.Tensor, "SymInt": int, "float": float, "bool": bool}


def typed_signature(spec: OpSpec) -> inspect.Signature:
    """The signature ``spec.schema()`` describes, with real annotations: ``triton_op`` ignores a given schema and
    infers one from the function, which a ``*args`` function cannot give."""
    params = [inspect.Parameter(f"in{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_ANNOTATIONS[k])
              for i, k in enumerate(spec.input_kinds)]
    ret: Any = torch.Tensor if spec.num_outputs == 1 else tuple[(torch.Tensor,) * spec.num_outputs]  # type: ignore[misc]
    return inspect.Signature(params, return_annotation=ret)


def _make_triton_op(name: str, schema: str, judged: JudgedPlan, spec: OpSpec) -> Any:
    def fn(*args: Any) -> Any:
        # Traced once, at compile time, into the graph: what is traced is the judged plan, never the forward.
        return _finish_outputs(_as_tuple(judged.traced(*args)), args, spec, check_alias=False)

    fn.__signature__ = typed_signature(spec)  # type: ignore[attr-defined]
    return torch.library.triton_op(name, fn, mutates_args=(), schema=schema)


def _register_autograd(op_def: Any, reference: Callable[..., Any], spec: OpSpec) -> None:
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        tensor_idx = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.tensor_idx = tensor_idx
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.save_for_backward(*[inputs[i] for i in tensor_idx])

    def backward(ctx: Any, *grads: Any) -> tuple:
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_idx, ctx.saved_tensors):
            args[i] = t
        diff = [i for i in ctx.tensor_idx if args[i].dtype.is_floating_point or args[i].dtype.is_complex]

        def f(*xs: Any) -> tuple:
            full = list(args)
            for i, x in zip(diff, xs):
                full[i] = x
            return _as_tuple(reference(*full))

        outs, vjp_fn = torch.func.vjp(f, *[args[i] for i in diff])
        cot = tuple(g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs))
        in_grads = vjp_fn(cot)
        result: list[Any] = [None] * len(args)
        for i, g in zip(diff, in_grads):
            result[i] = g
        return tuple(result)

    op_def.register_autograd(backward, setup_context=setup_context)
