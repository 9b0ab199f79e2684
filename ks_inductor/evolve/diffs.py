"""SEARCH/REPLACE edit blocks: parse them from a model's answer, apply them strictly, and write them from a
parent/child pair (for training rows).

Strict means: a SEARCH text that does not occur in the current program, or occurs more than once, fails the
whole edit with a message saying which block and why. It is never skipped silently.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_BLOCK = re.compile(r"<{5,9} SEARCH[^\n]*\n(.*?)\n?={5,9}[^\n]*\n(.*?)\n?>{5,9} REPLACE", re.S)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


class DiffError(Exception):
    """An edit that cannot be applied; the message is feedback for the next attempt."""


@dataclass
class EditBlock:
    search: str
    replace: str


def parse_blocks(text: str) -> list[EditBlock]:
    return [EditBlock(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]


def parse_rewrite(text: str) -> str | None:
    """A full program in a fenced code block (the largest one that defines ModelNew)."""
    blocks = [b for b in _FENCE.findall(text) if "class ModelNew" in b]
    return max(blocks, key=len) if blocks else None


def apply_blocks(source: str, blocks: list[EditBlock]) -> str:
    out = source
    for i, b in enumerate(blocks, 1):
        if not b.search.strip():
            raise DiffError(f"edit block {i} has an empty SEARCH section")
        n = out.count(b.search)
        if n == 0:
            # A common near miss: trailing whitespace or indentation drift. Say so, but do not guess.
            hint = ""
            stripped = [ln.strip() for ln in b.search.splitlines() if ln.strip()]
            if stripped and stripped[0] in out:
                hint = f" (its first line '{stripped[0][:60]}' does occur; check indentation and the lines after it)"
            raise DiffError(f"edit block {i}: the SEARCH text does not occur in the current program{hint}; "
                            "SEARCH must copy the current code exactly")
        if n > 1:
            raise DiffError(f"edit block {i}: the SEARCH text occurs {n} times; include more context so it is unique")
        out = out.replace(b.search, b.replace, 1)
    if out == source:
        raise DiffError("the edit blocks change nothing")
    return out


def apply_response(source: str, text: str) -> tuple[str, str]:
    """Apply a model's answer: edit blocks if there are any, else a full rewrite. Returns (child, kind)."""
    blocks = parse_blocks(text)
    if blocks:
        return apply_blocks(source, blocks), "llm-diff"
    rewrite = parse_rewrite(text)
    if rewrite is not None:
        if rewrite.strip() == source.strip():
            raise DiffError("the rewritten program is identical to the current one")
        return rewrite, "llm-rewrite"
    raise DiffError("no SEARCH/REPLACE block and no fenced program defining ModelNew was found in the answer")


def make_blocks(parent: str, child: str, context: int = 2) -> str:
    """SEARCH/REPLACE text that turns ``parent`` into ``child`` (each SEARCH unique in the parent). Changes whose
    context windows overlap or touch share one block, so the blocks apply one after another."""
    a, b = parent.splitlines(keepends=True), child.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    windows: list[list[int]] = []
    for tag, i1, i2, _, _ in ops:
        if tag == "equal":
            continue
        lo, hi = max(0, i1 - context), min(len(a), i2 + context)
        while True:
            search = "".join(a[lo:hi])
            if search and parent.count(search) == 1 or (lo == 0 and hi == len(a)):
                break
            lo, hi = max(0, lo - 1), min(len(a), hi + 1)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    out = []
    for lo, hi in windows:
        parts = []
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                parts.append("".join(a[max(i1, lo):min(i2, hi)]) if i1 < hi and i2 > lo else "")
            elif lo <= i1 and i2 <= hi:
                parts.append("".join(b[j1:j2]))
        search, replace = "".join(a[lo:hi]), "".join(parts)
        out.append(f"<<<<<<< SEARCH\n{search.rstrip(chr(10))}\n=======\n{replace.rstrip(chr(10))}\n>>>>>>> REPLACE")
    return "\n".join(out)
