"""Every setting of kernelsmith in one table: the settings objects, in sections, each field with where it comes from.

Six objects hold settings, each beside the part that reads it (``OBJECTS``): ``Settings`` (the environment, every
variable in :mod:`ks_core.settings`), ``BackendOptions`` (``torch.compile(options={"kernelsmith.*": ...})`` over the
environment), ``EvolveConfig`` and ``LLMConfig`` (a search and its LLM endpoint: the commands' flags, or the
backend's options when a compile searches), ``JudgeConfig`` (a judgment's protocol, derived from a search's
``EvolveConfig``) and ``GuardConfig`` (the graph guard's measurement). ``SECTIONS`` names every field of the five
above ``Settings`` with its sources, in the order they win: a flag or an option given, else the field of the object
it is taken from (``via``), else the environment (``env``, a ``Settings`` field), else the dataclass default.

The objects read their environment through :func:`derive` and :func:`derive_one`, so the variable behind a field
is written here and nowhere else. ``READ_WHERE_USED`` lists the settings read directly by the code that uses them
(a switch on a hot path, the home folder). ``tests/test_config.py`` fails on a field, a settings object or a
variable this table does not name.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ks_core.settings import Settings


@dataclass(frozen=True)
class Source:
    """Where one field's value comes from. ``env``: the ``Settings`` field read when nothing else sets it, through
    ``read`` (as it is, if None). ``option``: its ``torch.compile`` option. ``flags``: ``"command --flag"`` for
    each ``kernelsmith`` command line that sets it. ``via``: ``"Object.field"`` it is taken from when that object
    builds this one. ``note``: what the field is where its name does not say, and for a field set only in code,
    who sets it."""

    env: str | None = None
    read: Callable[[Any], Any] | None = None
    option: str | None = None
    flags: tuple[str, ...] = ()
    via: tuple[str, ...] = ()
    note: str = ""


def _flag(flag: str, *commands: str) -> tuple[str, ...]:
    return tuple(f"{c} {flag}" for c in commands)


_SEARCHES = ("evolve", "warm", "pack export")

# Where each settings object is defined (a path, so that this module names no module above it).
OBJECTS: dict[str, str] = {
    "Settings": "ks_core/settings.py",
    "BackendOptions": "ks_inductor/compiler/backend.py",
    "EvolveConfig": "ks_inductor/evolve/config.py",
    "LLMConfig": "ks_inductor/evolve/config.py",
    "JudgeConfig": "ks_inductor/judge/config.py",
    "GuardConfig": "ks_inductor/compiler/graph_guard.py",
}

SECTIONS: dict[str, dict[str, Source]] = {
    "BackendOptions": {
        "db": Source(env="db", option="kernelsmith.db"),
        "on_miss": Source(env="on_miss", option="kernelsmith.on_miss"),
        "budget": Source(env="budget", option="kernelsmith.budget"),
        "time_limit_s": Source(env="time_limit_s", option="kernelsmith.time_limit"),
        "min_speedup": Source(env="min_speedup", option="kernelsmith.min_speedup"),
        "enabled": Source(env="disabled", read=operator.not_, option="kernelsmith.enabled"),
        "triton_op": Source(env="triton_op", option="kernelsmith.triton_op"),
        "judge_backend": Source(env="judge_backend", option="kernelsmith.judge"),
        "mode": Source(env="mode", option="kernelsmith.mode"),
        "graph_guard": Source(env="graph_guard", option="kernelsmith.graph_guard"),
    },
    "EvolveConfig": {
        "budget": Source(flags=_flag("--budget", *_SEARCHES), via=("BackendOptions.budget",)),
        "time_limit_s": Source(flags=_flag("--time-limit", *_SEARCHES), via=("BackendOptions.time_limit_s",)),
        "islands": Source(flags=_flag("--islands", *_SEARCHES)),
        "backend": Source(flags=_flag("--backend", *_SEARCHES), via=("BackendOptions.judge_backend",)),
        "llm": Source(flags=("evolve --mutator",), note="the LLMConfig section; None: the embedded mutator"),
        "seed": Source(flags=_flag("--seed", *_SEARCHES)),
        "resume": Source(flags=("evolve --no-resume",)),
        "parallel": Source(flags=("evolve --parallel",)),
        "margin": Source(note="code only: how much a child's speedup bound must beat an incumbent's"),
        "retime_every": Source(note="code only: judged children between re-timings of the best elite"),
        "elite_size": Source(note="code only"),
        "migration_interval": Source(note="code only"),
        "judge_trials": Source(note="code only: the search judge's trials (JudgeConfig.trials)"),
        "final_candidates": Source(note="code only: leading elites judged again with the final protocol"),
        "final_grace_s": Source(note="code only: how long the best's final judgment may run past the time limit"),
        "inductor_seeds": Source(note="code only: seed the search from Inductor's own kernels too"),
        "parallel_regions": Source(flags=("warm --parallel-regions",)),
        "settle_at": Source(flags=_flag("--settle-at", *_SEARCHES)),
        "baselines": Source(note="set by pack export for its stack: the paths a kernel must beat"),
        "peers": Source(note="set by pack export for its stack: the factory of the stack's own kernel"),
        "in_graphs": Source(note="set by pack export for its stack: whether it runs kernels inside CUDA graphs"),
        "extra": Source(note="code only: kept with the run's configuration"),
    },
    "LLMConfig": {
        "base_url": Source(env="llm_base_url", flags=("evolve --llm-base-url",)),
        "model": Source(env="llm_model", flags=("evolve --llm-model",)),
        "api_key": Source(env="llm_api_key", flags=("evolve --llm-api-key",), note="never stored"),
        "concurrency": Source(env="llm_concurrency", flags=("evolve --llm-concurrency",)),
        "timeout_s": Source(flags=("evolve --llm-timeout",)),
        "max_retries": Source(note="code only"),
        "backoff_s": Source(note="code only"),
        "max_tokens": Source(note="code only"),
        "temperature": Source(note="code only"),
        "fallback": Source(flags=("evolve --llm-fallback",)),
        "inspirations": Source(note="code only: archive programs shown in a prompt"),
    },
    "JudgeConfig": {
        "backend": Source(flags=("eval --backend", "pack verify --backend", "pack import --backend"),
                          via=("EvolveConfig.backend",)),
        "trials": Source(flags=("eval --trials",), via=("EvolveConfig.judge_trials",)),
        "tolerances": Source(note="code only: (atol, rtol) per dtype"),
        "distributions": Source(note="code only: the input distributions the trials draw"),
        "compile_timeout_s": Source(note="code only"),
        "run_timeout_s": Source(note="code only"),
        "memory_limit_mb": Source(env="judge_memory_mb"),
        "device_memory_fraction": Source(note="code only"),
        "rounds": Source(note="the search protocol's (JudgeConfig.for_search), else the final one's"),
        "warmup_ms": Source(note="as rounds"),
        "rep_ms": Source(note="as rounds"),
        "min_reps": Source(note="code only"),
        "max_reps": Source(note="as rounds"),
        "rotating_sets": Source(note="code only"),
        "baselines": Source(via=("EvolveConfig.baselines",)),
        "final_rounds": Source(note="code only: the protocol a kernel passes before it is served"),
        "final_rep_ms": Source(note="code only"),
        "final_max_reps": Source(note="code only"),
        "final_warmup_ms": Source(note="code only"),
        "final_baselines": Source(via=("EvolveConfig.baselines",)),
        "peers": Source(via=("EvolveConfig.peers",)),
        "steady_state": Source(note="code only: also time inside a CUDA graph"),
        "search_steady_state": Source(note="off in the search protocol (JudgeConfig.for_search)"),
        "in_graphs": Source(via=("EvolveConfig.in_graphs",)),
        "margin": Source(note="code only"),
        "max_plausible_speedup": Source(note="code only"),
        "floor_slack": Source(note="code only"),
        "static_rules": Source(note="code only"),
        "seed": Source(note="code only: None draws a secret one per judge"),
        "keep_workdir": Source(note="code only"),
    },
    "GuardConfig": {
        "rounds": Source(note="code only"),
        "round_ms": Source(note="code only"),
        "max_calls": Source(note="code only"),
        "warmup_calls": Source(note="code only"),
        "q": Source(note="code only: the quantile of the bootstrap the bound is"),
        "budget_s": Source(note="code only: a graph slower than this to time is not timed"),
    },
}

# The files that keep something in kernelsmith's home folder (Settings.cache_home: home, else XDG_CACHE_HOME).
_HOME = ("kernel_cache/urls.py", "ks_inductor/source_module.py", "ks_inductor/compiler/kernel_ops.py",
         "ks_inductor/compiler/analysis_memo.py", "ks_inductor/judge/service.py")

# Settings read by the code that uses them rather than through a settings object -> the files that read them.
READ_WHERE_USED: dict[str, tuple[str, ...]] = {
    "home": _HOME,
    "xdg_cache_home": _HOME,
    "db": ("kernel_cache/urls.py", "ks_inductor/cli/output.py"),
    "analysis_cache": ("ks_inductor/compiler/analysis_memo.py",),
    "judge_fork": ("ks_inductor/judge/pool.py", "ks_inductor/seeds/inductor/generate.py"),
    "triton_interpret": ("ks_inductor/judge/backends.py", "ks_inductor/compiler/backend.py", "ks_inductor/demo.py"),
    "pack": ("integrations/guard.py",),
    "trusted_keys": ("integrations/serving.py",),
    "serve_race": ("integrations/race.py",),
    "serve_margin": ("integrations/race.py",),
    "benchmarks": ("ks_inductor/cli/bench.py",),
    "lock_dir": ("ks_inductor/judge/device_lock.py",),
}

# Variables read outside Settings, and why.
OUTSIDE_SETTINGS: dict[str, str] = {}


def _value(source: Source, raw: Any) -> Any:
    return source.read(raw) if source.read is not None else raw


def derive(section: str, settings: Settings | None = None) -> dict[str, Any]:
    """The fields of ``section`` the environment gives, from ``settings`` (default: the environment now)."""
    s = Settings.from_env() if settings is None else settings
    return {name: _value(src, getattr(s, src.env)) for name, src in SECTIONS[section].items() if src.env}


def derive_one(section: str, field: str) -> Any:
    """One field's value from the environment, read now (a default computed when the object is made)."""
    src = SECTIONS[section][field]
    if src.env is None:
        raise KeyError(f"{section}.{field} is not read from the environment")
    return _value(src, Settings.read(src.env))
