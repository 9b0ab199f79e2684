"""Candidate kernels as they move between the optimizer, the judge and the cache."""

from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

# CPython 3.11 can fail with "AST constructor recursion depth mismatch" when two threads parse at once; the judge
# and the optimizer parse from several threads, so every parse goes through here.
_PARSE_LOCK = threading.Lock()


def parse_source(source: str) -> ast.Module:
    with _PARSE_LOCK:
        return ast.parse(source)


def normalized_source_hash(source: str) -> str:
    """Hash of the source with comments, docstrings-as-comments and formatting removed.

    Two candidates that differ only in spacing or comments hash alike, so the optimizer never judges one twice.
    Unparseable source falls back to a whitespace-collapsed hash.
    """
    try:
        tree = parse_source(source)
        with _PARSE_LOCK:
            text = ast.unparse(tree)
    except SyntaxError:
        text = " ".join(source.split())
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Candidate:
    """Source defining ``ModelNew``, plus where it came from."""

    source: str
    params: dict[str, Any] = field(default_factory=dict)
    parent_id: str | None = None
    mutation: str = "seed"  # seed | param | variant | llm-diff | llm-rewrite | llm-seed | reference
    template: str | None = None
    variant: str | None = None
    generation: int = 0
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = self.source_hash[:16]

    @cached_property
    def source_hash(self) -> str:
        # Parsed and unparsed under a global lock: the evolver asks for it on every membership check.
        return normalized_source_hash(self.source)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Candidate:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
