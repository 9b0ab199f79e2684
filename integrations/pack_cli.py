"""``python -m integrations.pack_cli --for MODEL -o PACK``: the pack a transformers deployment of MODEL needs.

MODEL is a transformers model type (``llama``) or a config.json; the model is built with random weights (nothing
downloaded), run at each deployment shape (``--batch`` times every ``--seq``: the prefill lengths and, for
generation, ``--seq 1`` for the decode step), and the RMSNorm and SiLU·mul problems its layers meet are warmed
into the kernel cache and exported, with golden vectors, as one pack (``integrations.transformers.pack_for_model``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m integrations.pack_cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--for", dest="model", required=True, metavar="MODEL",
                   help="a transformers model type (llama, qwen2, ...) or a config.json")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="config override, e.g. --set hidden_size=4096 (repeatable)")
    p.add_argument("--batch", type=int, action="append", default=None, help="batch size (repeatable; default 1)")
    p.add_argument("--seq", type=int, action="append", default=None,
                   help="tokens per sequence per forward (repeatable; default 16)")
    p.add_argument("--dtype", default=None, help="model dtype (default bf16 on GPU, fp32 on CPU)")
    p.add_argument("--device", default=None, help="device (default cuda when available)")
    p.add_argument("--db", default=None, help="kernel cache URL or SQLite path (default: KERNELSMITH_DB)")
    p.add_argument("-o", "--output", required=True, help="the pack to write")
    p.add_argument("--budget", type=int, default=None, help="candidates judged per problem")
    p.add_argument("--backend", default=None, help="judge backend (triton-cuda, triton-maca, triton-interpret)")
    p.add_argument("--sign-key", default=None, help="ed25519 private key to sign the pack with")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from integrations.transformers import pack_for_model
    from ks_inductor.evolve import EvolveConfig
    from ks_inductor.warm import WarmError, hf_model, parse_overrides

    batches, seqs = args.batch or [1], args.seq or [16]
    try:
        model, (ids,) = hf_model(args.model, parse_overrides(args.overrides), batches[0], seqs[0], args.dtype,
                                 args.device)
    except WarmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    vocab = int(getattr(model.config, "vocab_size", 1000))
    gen = torch.Generator().manual_seed(0)
    inputs = [(torch.randint(0, vocab, (b, s), generator=gen).to(ids.device),) for b in batches for s in seqs]
    cfg: dict[str, Any] = {"backend": args.backend}
    if args.budget is not None:
        cfg["budget"] = args.budget
    build = pack_for_model(model, inputs, args.output, db=args.db, config=EvolveConfig(**cfg),
                           sign_key=args.sign_key)
    out = {"pack": args.output if build.export is not None else None,
           "problems": [{"name": p.name, "key": p.key, "inputs": p.signature()} for p in build.problems],
           "missing": build.missing, "kernels": build.export.kernels if build.export is not None else 0}
    if args.json:
        print(json.dumps(out))
    else:
        for p in out["problems"]:
            state = "missing" if p["key"] in build.missing else "packed"
            print(f"{p['name']:9} {p['key'][:16]} {p['inputs']:40} {state}")
        print(f"wrote {args.output}" if build.export is not None else "no kernel found; no pack written")
    return 0 if build.export is not None and not build.missing else 1


if __name__ == "__main__":
    sys.exit(main())
