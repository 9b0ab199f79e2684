"""kernelsmith's settings: every environment variable it reads, with its default and meaning, in one place.

    from ks_core.settings import Settings
    s = Settings.from_env()          # the environment over the defaults
    s.db, s.on_miss, s.cache_home()

Options given in code (``torch.compile(options={"kernelsmith.db": ...})``, ``EvolveConfig``, ``LLMConfig``, command
flags) win over these; these win over the defaults. The backend reads the environment at every compile, so a
changed variable takes effect without a restart. In the foundation, so that every package reads the same settings
(the kernel cache needs the home folder and the database too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _text(v: str) -> str | None:
    return v or None


def _on_unless_false(v: str) -> bool:
    return v.lower() not in _FALSE


def _on_if_true(v: str) -> bool:
    return v.lower() in _TRUE


def _auto_switch(v: str) -> str:
    """``auto``, or ``1`` / ``0`` for any of the words a switch accepts."""
    low = v.lower()
    return "1" if low in _TRUE else "0" if low in _FALSE else "auto"


def _float_or_none(v: str) -> float | None:
    return float(v) if v else None


def _int_or_none(v: str) -> int | None:
    return int(v) if v else None


@dataclass(frozen=True)
class Var:
    """One environment variable: the field it sets, how its text is read, and what it means."""

    env: str
    parse: Callable[[str], Any]
    doc: str


# field -> its variable. The one description of each; README's tables say the same in a user's words.
VARIABLES: dict[str, Var] = {
    "home": Var("KERNELSMITH_HOME", _text, "folder for the default cache, graph analyses and kernel modules "
                                          "(default $XDG_CACHE_HOME/kernelsmith, else ~/.cache/kernelsmith)"),
    "db": Var("KERNELSMITH_DB", _text, "kernel cache: an SQLite path, a postgresql:// URL or any SQLAlchemy URL "
                                       "(default kernels.db in the home folder)"),
    "on_miss": Var("KERNELSMITH_ON_MISS", str, "backend, a region without a kernel: fallback (Inductor), record "
                                               "(note it for warm --from-misses) or evolve (search during the compile)"),
    "budget": Var("KERNELSMITH_BUDGET", int, "backend, on_miss=evolve: candidates judged per region"),
    "time_limit_s": Var("KERNELSMITH_TIME_LIMIT", _float_or_none, "backend, on_miss=evolve: seconds per region"),
    "min_speedup": Var("KERNELSMITH_MIN_SPEEDUP", float, "backend: recorded speedup over Inductor a timed kernel "
                                                         "needs to be served"),
    "disabled": Var("KERNELSMITH_DISABLE", _on_if_true, "1: the backend is exactly Inductor and the serving "
                                                        "integrations call their stack's own code"),
    "triton_op": Var("KERNELSMITH_TRITON_OP", _on_unless_false, "backend, on a GPU: trace served kernels' judged "
                                                                "plans into Inductor's graph as triton_op"),
    "graph_guard": Var("KERNELSMITH_GRAPH_GUARD", str, "backend: auto, on or off: time the whole graph with its "
                                                       "swaps against Inductor and keep the faster"),
    "mode": Var("KERNELSMITH_MODE", _text, "backend: Inductor's mode (torch.compile refuses mode= with options=)"),
    "judge_backend": Var("KERNELSMITH_JUDGE_BACKEND", _text, "judge backend: triton-cuda, triton-maca or "
                                                             "triton-interpret (default: detected)"),
    "analysis_cache": Var("KERNELSMITH_ANALYSIS_CACHE", _on_unless_false, "0: do not keep graph analyses on disk"),
    "judge_fork": Var("KERNELSMITH_JUDGE_FORK", _on_unless_false, "0: start judge workers from scratch "
                                                                  "instead of forking a warm server per device"),
    "judge_memory_mb": Var("KERNELSMITH_JUDGE_MEMORY_MB", int, "address-space limit of a judge worker, MiB"),
    "llm_base_url": Var("KERNELSMITH_LLM_BASE_URL", _text, "LLM mutator: an OpenAI-compatible endpoint"),
    "llm_model": Var("KERNELSMITH_LLM_MODEL", _text, "LLM mutator: the model name"),
    "llm_api_key": Var("KERNELSMITH_LLM_API_KEY", _text, "LLM mutator: the API key (never stored)"),
    "llm_concurrency": Var("KERNELSMITH_LLM_CONCURRENCY", _int_or_none, "LLM mutator: requests in flight "
                                                                        "(default 2)"),
    "pack": Var("KERNELSMITH_PACK", _text, "serving integrations: the pack whose kernels they serve"),
    "trusted_keys": Var("KERNELSMITH_TRUSTED_KEYS", str, "serving integrations: trusted ed25519 public keys "
                                                         "(files or inline), separated by commas"),
    "serve_race": Var("KERNELSMITH_SERVE_RACE", _auto_switch, "serving integrations: auto, 1 or 0: time each "
                                                              "kernel against the stack's own path on first use "
                                                              "and serve it only where it is faster (auto: on a "
                                                              "GPU, off under the Triton interpreter)"),
    "serve_margin": Var("KERNELSMITH_SERVE_MARGIN", float, "serving integrations, racing: how much faster a kernel "
                                                           "must be, as a ratio (our time x margin <= the "
                                                           "stack's own)"),
    "benchmarks": Var("KERNELSMITH_BENCHMARKS", _text, "kernelsmith bench and report: the checkout whose "
                                                       "benchmarks/ they run (default: this directory, or the "
                                                       "source tree)"),
    "triton_interpret": Var("TRITON_INTERPRET", _on_if_true, "Triton's own: 1 runs kernels on the CPU through "
                                                             "the interpreter"),
    "xdg_cache_home": Var("XDG_CACHE_HOME", _text, "where the default home folder goes"),
    "lock_dir": Var("KERNELSMITH_LOCK_DIR", str, "the device locks' folder, shared by every kernelsmith process "
                                                 "on the host that times on a device"),
}


@dataclass(frozen=True)
class Settings:
    home: str | None = None
    db: str | None = None
    on_miss: str = "fallback"
    budget: int = 16
    time_limit_s: float | None = None
    min_speedup: float = 1.0
    disabled: bool = False
    triton_op: bool = True
    graph_guard: str = "auto"
    mode: str | None = None
    judge_backend: str | None = None
    analysis_cache: bool = True
    judge_fork: bool = True
    judge_memory_mb: int = 16384
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: str | None = None
    llm_concurrency: int | None = None
    pack: str | None = None
    trusted_keys: str = ""
    serve_race: str = "auto"
    serve_margin: float = 1.03
    benchmarks: str | None = None
    triton_interpret: bool = False
    xdg_cache_home: str | None = None
    lock_dir: str = "/tmp/kernelsmith-locks"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The defaults with every variable that is set (and not empty) read over them."""
        env = os.environ if environ is None else environ
        values = {}
        for name, var in VARIABLES.items():
            raw = env.get(var.env)
            if raw:
                values[name] = var.parse(raw)
        return cls(**values)

    @classmethod
    def read(cls, name: str, environ: Mapping[str, str] | None = None) -> Any:
        """One setting, read now: for a switch checked on a hot path (a served call), where reading them all would
        cost more than the call."""
        var = VARIABLES[name]
        raw = (os.environ if environ is None else environ).get(var.env)
        return var.parse(raw) if raw else _DEFAULTS[name]

    def cache_home(self) -> Path:
        """``home``, else ``$XDG_CACHE_HOME/kernelsmith``, else ``~/.cache/kernelsmith``."""
        if self.home:
            return Path(self.home).expanduser()
        return Path(self.xdg_cache_home or os.path.join(os.path.expanduser("~"), ".cache")) / "kernelsmith"

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every setting, for documentation and ``--help`` texts."""
        return [(VARIABLES[f.name].env, repr(f.default), VARIABLES[f.name].doc) for f in fields(cls)]


_DEFAULTS = {f.name: f.default for f in fields(Settings)}
assert set(_DEFAULTS) == set(VARIABLES), "every setting has its variable"
