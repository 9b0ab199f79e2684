"""Which stack versions an integration serves: a version nobody checked is served by the stack itself."""

from __future__ import annotations

import logging
import re

log = logging.getLogger("kernelsmith.integrations")


def parse_version(text: str) -> tuple[int, ...]:
    """``5.24.0.dev0+local`` -> (5, 24, 0): the leading numeric release, enough to compare against known ranges."""
    parts = []
    for piece in text.split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


def version_known(stack: str, version: str | None, lowest: tuple[int, ...], below: tuple[int, ...]) -> bool:
    """Whether ``version`` lies in [lowest, below); otherwise warn once and say the stack keeps its own path.

    The integrations patch layer internals a stack may change in any release: a version nobody checked is served
    by the stack itself rather than risk a wrong swap."""
    parsed = parse_version(version or "")
    if parsed and lowest <= parsed < below:
        return True
    span = f"{'.'.join(map(str, lowest))} <= version < {'.'.join(map(str, below))}"
    log.warning("kernelsmith: %s %s is not a version this integration knows (%s); %s keeps its own kernels",
                stack, version or "(unknown)", span, stack)
    return False


def installed_version(module: str) -> str | None:
    """``module.__version__`` of an installed stack, None where it is not importable."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return str(getattr(mod, "__version__", "")) or None
