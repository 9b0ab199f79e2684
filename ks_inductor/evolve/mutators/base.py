"""What a mutation step produces, and strategy descriptors for code no template rendered."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from ks_inductor.candidate import Candidate
from ks_inductor.seeds.families.template import block_class


@dataclass
class Mutation:
    """One attempted step. ``candidate`` is None when the step failed before the judge (a diff that did not
    apply, an unreachable model): that is recorded as a failed step with ``error`` as its feedback. ``kind`` is what
    the step records as its mutation; ``operator`` names what made the change: a structural operator
    (``ks_inductor.evolve.operators``), or the kind itself ("param", "tweak", "llm-diff", ...)."""

    kind: str
    candidate: Candidate | None = None
    diff: str = ""
    prompt: str | None = None
    response: str | None = None
    error: str | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    descriptor: dict[str, Any] | None = None
    operator: str = ""

    def __post_init__(self) -> None:
        if not self.operator:
            self.operator = self.kind


def unified_diff(parent: str, child: str) -> str:
    return "".join(difflib.unified_diff(parent.splitlines(keepends=True), child.splitlines(keepends=True),
                                        "parent.py", "child.py", n=2))


_INT_KW = re.compile(r"\b(num_warps|num_stages|BLOCK\w*|GROUP_M|ROWS|WAVES)\s*=\s*(\d+)")


def describe_source(source: str) -> dict[str, Any]:
    """Strategy descriptor of arbitrary kernel source (LLM-written), from a scan of its launch parameters."""
    vals: dict[str, list[int]] = {}
    for m in _INT_KW.finditer(source):
        vals.setdefault(m.group(1), []).append(int(m.group(2)))
    blocks = [v for k, vs in vals.items() if k.startswith("BLOCK") for v in vs]
    block = 1
    for b in blocks[:2]:
        block *= b
    n_kernels = len(re.findall(r"@triton\.jit", source))
    launches = len(re.findall(r"\w+\[[^\]]*\]\(", source))
    return {
        "block": block_class(block) if blocks else "?",
        "warps": max(vals.get("num_warps", [4])),
        "stages": max(vals.get("num_stages", [1])),
        "dot": "tl.dot(" in source,
        "fusion": 1.0 / max(1, launches) if n_kernels else 0.0,
        "persistent": "tl.num_programs(" in source,
        "variant": "llm",
    }
