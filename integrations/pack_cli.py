"""``kernelsmith pack export --for MODEL -o PACK``: the pack a serving deployment of MODEL needs.

MODEL is a transformers model type (``llama``) or a config.json. For ``--stack transformers`` the model is built
with random weights (nothing downloaded) and run at each deployment shape (every ``--batch`` times every
``--seq``: the prefill lengths and, for generation, ``--seq 1`` for the decode step); the RMSNorm and SiLU·mul
problems its layers meet are what the pack holds (``integrations.transformers.pack_for_model``). For
``--stack sglang``, ``vllm`` and ``lmdeploy`` only the config is read: the stack's ``RMSNorm`` (with and without the
residual) and ``SiluAndMul`` at every token count ``batch * seq`` are the problems (each integration's
``layer_problems``: ``(tokens, hidden)`` activations, ``(1, tokens, hidden)`` for LMDeploy, whose engine packs a
batch's tokens into one sequence; needs the stack's Python part). The problems are warmed into the kernel cache and their verified kernels for this machine
exported, with golden vectors, as one pack (``integrations.ops.pack_for_problems``).

The ``kernelsmith`` command mounts this module after ``ks_inductor.pack_cli``: :func:`register` adds these
arguments to ``pack export`` and hands an export with ``--for`` to :func:`export_for_model`. Only the integrations
know a model's serving layers, so the command reaches down to them, never the other way round.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

STACKS = ("transformers", "sglang", "vllm", "lmdeploy")
# The arguments that only mean something with --for (dest -> flag), and those that cannot go with it.
_WITH_FOR = {"stack": "--stack", "hf_set": "--hf-set", "batch": "--batch", "seq": "--seq", "dtype": "--dtype",
             "device": "--device", "backend": "--backend"}
_NOT_WITH_FOR = {"keys": "--key", "family": "--family", "fingerprint": "--fingerprint"}


def register(subparsers: Any) -> None:
    """Add ``--for MODEL`` and its flags to ``kernelsmith pack export`` (mounted by ``ks_inductor.cli``)."""
    pack = subparsers.choices.get("pack")
    if pack is None:
        return
    export = next(a for a in pack._actions if isinstance(a, argparse._SubParsersAction)).choices["export"]
    add_arguments(export)
    export_cache = export.get_default("func")

    def export_pack_or_model(args: argparse.Namespace) -> int:
        check(args)
        return export_for_model(args) if args.model is not None else export_cache(args)

    export.set_defaults(func=export_pack_or_model)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The model-aware arguments of ``kernelsmith pack export``."""
    from ks_inductor.cli import add_backend_argument, add_search_arguments, positive_int

    g = p.add_argument_group("the pack a deployment needs (--for)")
    g.add_argument("--for", dest="model", metavar="MODEL", default=None,
                   help="build the pack a deployment of MODEL needs: warm the kernel cache for the layers MODEL "
                        "runs at the deployment's shapes, then export exactly their kernels; MODEL is a "
                        "transformers model type such as 'llama' or a config.json (random weights, nothing "
                        "downloaded)")
    g.add_argument("--stack", choices=STACKS, default=None,
                   help="with --for: the serving stack whose layers the pack is for (default transformers; "
                        "sglang, vllm and lmdeploy need that stack's Python part installed)")
    g.add_argument("--hf-set", metavar="KEY=VALUE", action="append", default=None,
                   help="with --for: override a config field, e.g. --hf-set hidden_size=4096 (repeatable)")
    g.add_argument("--batch", type=positive_int, action="append", default=None, metavar="N",
                   help="with --for: a batch size the deployment serves (repeatable; default 1)")
    g.add_argument("--seq", type=positive_int, action="append", default=None, metavar="N",
                   help="with --for: tokens per sequence in one forward: each prefill length, and 1 for the "
                        "decode step (repeatable; default 16)")
    g.add_argument("--dtype", default=None,
                   help="with --for: the model's dtype (default bf16 on GPU, fp32 on CPU)")
    g.add_argument("--device", default=None, help="with --for: device (default cuda when available)")
    add_backend_argument(g)
    add_search_arguments(g, per="layer problem", budget=32)


def check(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together (a UsageError: one line, exit code 2)."""
    from ks_inductor.cli import UsageError

    if args.model is None:
        given = [flag for dest, flag in _WITH_FOR.items() if getattr(args, dest) not in (None, [])]
        if given:
            raise UsageError(f"{given[0]} applies only with --for MODEL")
        return
    given = [flag for dest, flag in _NOT_WITH_FOR.items() if getattr(args, dest) not in (None, [])]
    if given:
        raise UsageError(f"{given[0]} selects kernels from the cache, --for selects them from the model: "
                         "give one or the other")


def _dtype(name: str | None, device: str) -> Any:
    import torch

    from ks_inductor.cli import UsageError

    if name is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    dt = getattr(torch, aliases.get(name, name), None)
    if not isinstance(dt, torch.dtype):
        raise UsageError(f"--dtype {name!r}: not a torch dtype (bf16, fp16, fp32, bfloat16, ...)")
    return dt


def _hf_config(model: str, overrides: dict[str, Any]) -> Any:
    from ks_inductor.cli import UsageError

    try:
        import transformers
    except ImportError:
        raise UsageError("--for needs `transformers` to read the model's config (pip install transformers)") from None
    path = Path(model)
    try:
        if path.is_file():
            return transformers.AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json"
                                                           else str(path), **overrides)
        return transformers.AutoConfig.for_model(model, **overrides)
    except Exception as e:  # noqa: BLE001 - whatever transformers says about the name or the file
        raise UsageError(f"cannot build a transformers config from {model!r}: {e}") from None


def _problems(args: argparse.Namespace, batches: list[int], seqs: list[int]) -> list[Any]:
    import torch

    from ks_inductor.cli import UsageError
    from ks_inductor.warm import WarmError, hf_model, parse_overrides

    try:
        overrides = parse_overrides(args.hf_set or [])
    except WarmError as e:
        raise UsageError(str(e)) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if (args.stack or "transformers") == "transformers":
        from .transformers import layer_problems

        dtype = str(_dtype(args.dtype, device)).removeprefix("torch.")
        try:
            model, (ids,) = hf_model(args.model, overrides, batches[0], seqs[0], dtype, device)
        except WarmError as e:
            raise UsageError(str(e)) from None
        vocab = int(getattr(model.config, "vocab_size", 1000))
        gen = torch.Generator().manual_seed(0)
        inputs = [(torch.randint(0, vocab, (b, s), generator=gen).to(ids.device),) for b in batches for s in seqs]
        return layer_problems(model, inputs)
    return _config_problems(args, overrides, device, batches, seqs)


# Stacks whose layer problems come from the config alone: the module with their ``layer_problems``, and whether
# their activations carry a leading dimension of 1 (LMDeploy's engine packs a batch's tokens into one sequence).
_CONFIG_STACKS = {"sglang": ("sglang", False), "vllm": ("vllm", False), "lmdeploy": ("lmdeploy", True)}


def _config_problems(args: argparse.Namespace, overrides: dict[str, Any], device: str, batches: list[int],
                     seqs: list[int]) -> list[Any]:
    """A stack's RMSNorm (with and without the residual) and SiluAndMul at every token count a deployment runs,
    from the model's config: these stacks run ``(tokens, hidden)`` activations, whatever the batch."""
    import importlib

    from ks_inductor.cli import UsageError

    module, packed = _CONFIG_STACKS[args.stack]
    try:
        layer_problems = importlib.import_module(f"{__package__}.{module}").layer_problems
    except ImportError as e:
        raise UsageError(f"--stack {args.stack} needs {args.stack}'s Python part: {e}") from None
    cfg = _hf_config(args.model, overrides)
    dtype = _dtype(args.dtype, device)
    missing = [k for k in ("hidden_size", "intermediate_size") if not getattr(cfg, k, None)]
    if missing:
        raise UsageError(f"the config of {args.model!r} has no {missing[0]}: not a gated-MLP decoder")
    hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
    eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
    lead = (1,) if packed else ()
    tokens = sorted({b * s for b in batches for s in seqs})
    norms = [((*lead, t, hidden), dtype, eps) for t in tokens]
    try:
        return layer_problems(norms, [((*lead, t, 2 * inter), dtype) for t in tokens], norms)
    except ImportError as e:
        raise UsageError(f"--stack {args.stack} needs {args.stack}'s Python part: {e}") from None


def export_for_model(args: argparse.Namespace) -> int:
    """``pack export --for``: 0 when every layer problem has a kernel in the pack, 1 when some or all have none
    (the pack then holds the others; none is written when no problem has a kernel)."""
    from rich.console import Console

    from kernel_cache.errors import CacheError
    from ks_inductor.cli import UsageError
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.judge.backends import BackendUnavailable

    from .ops import pack_for_problems

    check(args)
    batches, seqs = args.batch or [1], args.seq or [16]
    console = Console(stderr=True)
    with console.status(f"finding the layer problems of {args.model}"):
        problems = _problems(args, batches, seqs)
    if not problems:
        raise UsageError(f"{args.model}: none of its layers is one a {args.stack or 'transformers'} pack serves")
    config = EvolveConfig(budget=args.budget, time_limit_s=args.time_limit, islands=args.islands,
                          backend=args.backend, seed=args.seed)
    try:
        build = pack_for_problems(problems, args.output, db=args.db, config=config, sign_key=args.sign_key,
                                  console=console, vectors=not args.no_vectors, min_speedup=args.min_speedup)
    except BackendUnavailable as e:
        raise UsageError(str(e)) from None
    except CacheError as e:
        raise UsageError(str(e)) from None
    res = build.export
    out = {"pack": res.path if res is not None else None, "stack": args.stack or "transformers",
           "problems": [{"name": p.name, "key": p.key, "inputs": p.signature(),
                         "packed": p.key not in build.missing} for p in build.problems],
           "missing": build.missing, "kernels": res.kernels if res is not None else 0,
           "with_vectors": res.with_vectors if res is not None else 0, "signed": bool(res and res.signed)}
    if args.json:
        print(json.dumps(out))
    else:
        c = Console()
        for p in out["problems"]:
            c.print(f"{p['name']:13} {p['key'][:16]} {p['inputs']:44} {'packed' if p['packed'] else 'missing'}",
                    highlight=False)
        if res is None:
            c.print("no layer problem has a verified kernel for this machine; no pack written", highlight=False)
        else:
            c.print(f"wrote [bold]{res.path}[/]: {res.kernels} kernel(s) for {res.problems} of "
                    f"{len(build.problems)} layer problem(s), golden vectors for {res.with_vectors}"
                    f"{', signed' if res.signed else ''}", highlight=False)
    return 0 if res is not None and not build.missing else 1
