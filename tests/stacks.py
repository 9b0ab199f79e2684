"""The serving stacks the integration tests run against, imported for real: skipped where a stack is not installed,
failed under ``CI=true``, where ``make test`` installs every one of them (docs/serving.md), so a CI run without a
stack cannot pass while testing nothing."""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType

import pytest

from tests.postgres_server import _in_ci


def require_stack(module: str, how: str) -> ModuleType:
    """Import ``module`` of a serving stack, or skip (fail under CI) saying why and ``how`` to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # a stack missing, or one of the packages its module imports
        reason = f"{module} does not import ({type(e).__name__}: {e}); {how}"
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def plugin_module(group: str, name: str = "kernelsmith") -> ModuleType:
    """The module of our entry point in ``group``, imported by the name the installed metadata gives it: the one a
    stack's plugin loader imports (``kernelsmith_integrations.*`` when installed), not the checkout's
    ``integrations`` package, which is the same code under another module name with a state of its own."""
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    if not found:
        reason = f"no {name!r} entry point in {group!r}: kernelsmith is not installed here (pip install -e .)"
        if _in_ci():
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return importlib.import_module(found[0].module)
