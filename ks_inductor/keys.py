"""The canonical problem key: the one place it is computed.

The backend, the optimizer, the cache and packs all call :func:`canonical_key`, so a region met at compile time,
a problem file given to ``evolve`` and a pack entry agree on identity. The key hashes the aten graph with node
names replaced by position, numbers printed one way, each node's output dtype and shape, and the inputs' shapes,
dtypes and strides.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

KEY_VERSION = "ks-key-v1"


def _fmt(v: Any, names: dict[Any, str]) -> str:
    import torch
    import torch.fx as fx

    if isinstance(v, fx.Node):
        return names[v]
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, float):
        if math.isnan(v):
            return "fnan"
        if math.isinf(v):
            return "finf" if v > 0 else "f-inf"
        return f"f{float.hex(v)}"  # exact and spelling-free: 2.0, 2., 2e0 all print alike
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x, names) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}={_fmt(v[k], names)}" for k in sorted(v)) + "}"
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, torch.device):
        return "dev"  # the device a region ran on is not part of what it computes
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    return type(v).__name__ + ":" + repr(v)


def _val(node: Any) -> str:
    import torch

    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).replace('torch.', '')}{list(val.shape)}"
    if isinstance(val, (list, tuple)):
        return "(" + ",".join(
            f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" if isinstance(v, torch.Tensor) else "-"
            for v in val
        ) + ")"
    return "-"


def normalized_graph_text(gm: Any, input_specs: Sequence[Any]) -> str:
    """Spelling-free text of an aten graph plus its input signature."""
    names: dict[Any, str] = {}
    lines = [KEY_VERSION]
    for spec in input_specs:
        if spec.kind == "tensor":
            lines.append(f"in {spec.dtype} {list(spec.shape)} {list(spec.stride)}")
        else:
            lines.append(f"in value {_fmt(spec.value, names)}")
    placeholder_i = 0
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            names[node] = f"p{placeholder_i}"
            placeholder_i += 1
            lines.append(f"{names[node]} = placeholder {_val(node)}")
            continue
        names[node] = f"n{i}"
        if node.op == "output":
            lines.append(f"return {_fmt(node.args[0], names)}")
        elif node.op == "get_attr":
            lines.append(f"{names[node]} = constant {_val(node)}")
        else:
            args = _fmt(list(node.args), names)
            kwargs = _fmt(dict(node.kwargs), names)
            lines.append(f"{names[node]} = {node.target}{args}{kwargs} -> {_val(node)}")
    return "\n".join(lines)


def canonical_key(gm: Any, input_specs: Sequence[Any]) -> str:
    text = normalized_graph_text(gm, input_specs)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
