"""The model a command reads from its flags (``warm``, ``explain``, ``pack export``): a factory, a KernelBench file,
or a transformers config with random weights at every ``--batch`` times ``--seq``."""

from __future__ import annotations

import argparse
from typing import Any

from ks_inductor.cli.args import UsageError, batches, seqs

# The flags that only mean something with --hf-config (dest -> flag).
HF_ONLY = {"hf_set": "--hf-set", "batch": "--batch", "seq": "--seq", "dtype": "--dtype", "device": "--device"}


def check_hf_flags(args: argparse.Namespace) -> None:
    """Refuse the config's flags without a config, and a config beside another source."""
    if args.hf_config is None:
        given = [flag for dest, flag in HF_ONLY.items() if getattr(args, dest, None) not in (None, [])]
        if given:
            raise UsageError(f"{given[0]} applies only with --hf-config MODEL")
    elif getattr(args, "source", None):
        raise UsageError(f"give {args.source} or --hf-config {args.hf_config}, not both")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    from ks_inductor.warm import WarmError, parse_overrides

    try:
        return parse_overrides(args.hf_set or [])
    except WarmError as e:
        raise UsageError(str(e)) from None


def model_and_inputs(args: argparse.Namespace, sources: str) -> tuple[Any, list[tuple]]:
    """The model and its example inputs: one set for a factory or a KernelBench file, one per shape for a
    transformers config. ``sources`` says what this command accepts, for the error when nothing was given."""
    from ks_inductor.warm import WarmError, hf_model, load_factory
    from ks_inductor.warm.sources import hf_inputs

    check_hf_flags(args)
    try:
        if args.hf_config:
            model, _ = hf_model(args.hf_config, overrides(args), batches(args)[0], seqs(args)[0], args.dtype,
                                args.device)
            return model, hf_inputs(model, batches(args), seqs(args))
        if args.source:
            model, inputs = load_factory(args.source)
            return model, [inputs]
    except WarmError as e:
        raise UsageError(str(e)) from None
    raise UsageError(f"give {sources}")
