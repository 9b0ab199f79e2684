"""The analysis of a graph (node classifications, region problems) kept on disk, so that a second process compiling
the same graph reads its regions' keys instead of tracing every node and region to aten again."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from ks_core.settings import VARIABLES, Settings
from ks_inductor import keys

if TYPE_CHECKING:
    from ks_core.problem_record import Problem

log = logging.getLogger(__name__)

ANALYSIS_CACHE_ENV = VARIABLES["analysis_cache"].env  # "0" turns the on-disk memo off
_MEMO_FORMAT = 2  # raised whenever the partition classifies some op differently: memos made before are stale


@functools.lru_cache(maxsize=4)
def analysis_salt(code: tuple[ModuleType, ...]) -> str:
    """What the analysis of a graph depends on besides the graph: torch (decompositions, tracing), this memo's
    format and ``code``, the modules that classify nodes and build keys (the caller names them). Any change to
    either starts a new memo."""
    h = hashlib.sha256(f"{_MEMO_FORMAT}|{torch.__version__}|{keys.KEY_VERSION}".encode())
    for mod in (sys.modules[__name__], keys, *code):
        h.update(Path(str(mod.__file__)).read_bytes())
    return h.hexdigest()


def analysis_cache_dir() -> Path | None:
    """Where graph analyses are kept (``$KERNELSMITH_HOME/analysis``); None when turned off."""
    s = Settings.from_env()
    return s.cache_home() / "analysis" if s.analysis_cache else None


class AnalysisMemo:
    """The analysis of one graph kept on disk: node classifications and region problems by stable signature.

    A second process compiling the same graph reads its regions' problems (keys) from here instead of tracing
    every node and region to aten again. Only graphs whose every node has a stable signature get one (functions
    of torch and ``operator``, aten/prims ops, tensor methods); the file name hashes those signatures with the
    salt (:func:`analysis_salt`). The entries are keyed by the same signatures as the in-process memos, so an entry can
    only answer for the computation it was made from. A file that cannot be read or parsed is ignored.
    """

    def __init__(self, path: Path | None, data: dict[str, Any] | None, salt: str = "") -> None:
        self.path = path
        self.salt = salt
        data = data or {}
        nodes, problems = data.get("nodes"), data.get("problems")
        self._nodes: dict[str, Any] = nodes if isinstance(nodes, dict) else {}
        self._problems: dict[str, Any] = problems if isinstance(problems, dict) else {}
        self.dirty = False

    @classmethod
    def load(cls, graph_text: str, salt: str) -> AnalysisMemo | None:
        """The memo of the graph ``graph_text`` (its nodes' signatures) under ``salt``; None when memos are off
        or unavailable."""
        try:
            directory = analysis_cache_dir()
            if directory is None:
                return None
            name = hashlib.sha256(f"{salt}\n{graph_text}".encode()).hexdigest()[:40]
            path = directory / f"{name}.json"
            data = None
            if path.exists():
                with open(path) as f:
                    data = json.load(f)
                if not isinstance(data, dict) or data.get("salt") != salt:
                    data = None
            return cls(path, data, salt)
        except Exception as e:  # noqa: BLE001 - no memo is only slower
            log.debug("analysis memo unavailable: %s", e)
            return None

    def node(self, sig: str) -> tuple[list[str], str, str | None] | None:
        e = self._nodes.get(sig)
        if (isinstance(e, list) and len(e) == 3 and isinstance(e[0], list) and isinstance(e[1], str)
                and (e[2] is None or isinstance(e[2], str))):
            return list(e[0]), e[1], e[2]
        return None

    def put_node(self, sig: str, entry: tuple[list[str], str, str | None]) -> None:
        value = [list(entry[0]), entry[1], entry[2]]
        if self._nodes.get(sig) != value:
            self._nodes[sig] = value
            self.dirty = True

    def problem(self, memo_key: str) -> dict[str, Any] | None:
        e = self._problems.get(memo_key)
        return e if isinstance(e, dict) else None

    def put_problem(self, memo_key: str, problem: Problem) -> None:
        if not isinstance(self._problems.get(memo_key), dict):
            self._problems[memo_key] = problem.to_json()
            self.dirty = True

    def save(self) -> None:
        if not self.dirty or self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"salt": self.salt, "nodes": self._nodes, "problems": self._problems}, f)
            os.replace(tmp, self.path)  # readers see the old file or the new one, never a torn one
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.dirty = False

