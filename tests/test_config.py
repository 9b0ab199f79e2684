"""The settings table (ks_core.config) against the code: every field of every settings object has its entry, every
variable feeds a field or is read where the table says, and the objects take their environment through it."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from ks_core.config import OBJECTS, OUTSIDE_SETTINGS, READ_WHERE_USED, SECTIONS, Source, derive
from ks_core.settings import VARIABLES, Settings

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("ks_core", "kernel_cache", "ks_inductor", "integrations")
# Dataclasses whose names read like settings but hold none.
NOT_SETTINGS = {"LaunchConfig": "one Triton launch's block sizes and warps, part of a kernel"}
# A value for each variable a section reads, other than its default: what the environment would hold.
RAW = {"db": "sqlite:////elsewhere/k.db", "on_miss": "record", "budget": "7", "time_limit_s": "12.5",
       "min_speedup": "1.5", "disabled": "1", "triton_op": "0", "judge_backend": "triton-interpret",
       "mode": "max-autotune", "graph_guard": "off", "llm_base_url": "http://llm.invalid/v1", "llm_model": "m7",
       "llm_api_key": "key", "llm_concurrency": "5", "judge_memory_mb": "1234"}


def _class(name: str) -> type:
    module = OBJECTS[name].removesuffix(".py").replace("/", ".")
    return getattr(importlib.import_module(module), name)


def _library_files() -> list[Path]:
    return [f for pkg in LIBRARY for f in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_field_of_every_settings_object_has_its_entry(name: str) -> None:
    fields = {f.name for f in dataclasses.fields(_class(name))}
    listed = set(SECTIONS[name])
    assert fields == listed, (f"{name}: fields without an entry in ks_core.config: {sorted(fields - listed)}; "
                              f"entries without a field: {sorted(listed - fields)}")


def test_every_settings_object_is_in_the_table() -> None:
    found = {m.group(1) for f in _library_files()
             for m in re.finditer(r"^class (\w*(?:Config|Options|Settings))\b", f.read_text(), re.M)}
    assert found - set(NOT_SETTINGS) == set(OBJECTS), "settings objects not in ks_core.config.OBJECTS"
    assert set(SECTIONS) == set(OBJECTS) - {"Settings"}


def test_every_variable_feeds_a_field_or_is_read_where_used() -> None:
    settings = {f.name for f in dataclasses.fields(Settings)}
    fed = {src.env for section in SECTIONS.values() for src in section.values() if src.env}
    assert fed <= settings, f"sections read settings that do not exist: {sorted(fed - settings)}"
    assert set(READ_WHERE_USED) <= settings
    assert not settings - fed - set(READ_WHERE_USED), "settings no object and no code reads"


def _direct_reads(text: str) -> set[str]:
    """The settings a file reads itself: ``Settings.read("x")``, ``Settings.from_env().x`` (also through a name it
    binds), and the home folder's two through ``cache_home()``."""
    names = set(re.findall(r'Settings\.read\("(\w+)"\)', text))
    attrs = re.findall(r"Settings\.from_env\(\)\.(\w+)", text)
    for var in re.findall(r"(\w+) = Settings\.from_env\(\)$", text, re.M):
        attrs += re.findall(rf"\b{var}\.(\w+)", text)
    for a in attrs:
        names |= {"home", "xdg_cache_home"} if a == "cache_home" else {a}
    return names


def test_settings_are_read_directly_exactly_where_the_table_says() -> None:
    where: dict[str, set[str]] = {}
    for f in _library_files():
        if f.parent.name == "ks_core" and f.name in ("settings.py", "config.py"):
            continue  # where they are defined
        for name in _direct_reads(f.read_text()):
            where.setdefault(name, set()).add(str(f.relative_to(ROOT)))
    assert where == {name: set(files) for name, files in READ_WHERE_USED.items()}


def test_direct_reads_are_found() -> None:
    text = ('a = Settings.read("pack")\nb = Settings.from_env().db\ns = Settings.from_env()\n'
            'd = s.cache_home() / "x" if s.analysis_cache else None\ne = Settings.from_env().benchmarks\ne.strip()\n')
    assert _direct_reads(text) == {"pack", "db", "home", "xdg_cache_home", "analysis_cache", "benchmarks"}


def test_the_variables_outside_settings_are_named() -> None:
    known = {v.env for v in VARIABLES.values()} | set(OUTSIDE_SETTINGS)
    seen = {m for f in _library_files() for m in re.findall(r"\bKERNELSMITH_[A-Z_]+\b", f.read_text())}
    assert seen <= known, f"variables neither in Settings nor in OUTSIDE_SETTINGS: {sorted(seen - known)}"
    assert set(OUTSIDE_SETTINGS) <= seen


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every variable a section reads set to RAW; the value each reads as."""
    for var in VARIABLES.values():
        monkeypatch.delenv(var.env, raising=False)
    fed = {src.env for section in SECTIONS.values() for src in section.values() if src.env}
    assert fed <= set(RAW), f"give RAW a value for {sorted(fed - set(RAW))}"
    for name in fed:
        monkeypatch.setenv(VARIABLES[name].env, RAW[name])
    return {name: VARIABLES[name].parse(RAW[name]) for name in fed}


def _expected(src: Source, parsed: dict[str, Any]) -> Any:
    raw = parsed[src.env]
    return src.read(raw) if src.read else raw


def _made(name: str) -> Any:
    """The object as the product makes it from the environment."""
    if name == "BackendOptions":
        return _class(name).resolve({})[0]
    if name == "LLMConfig":
        return _class(name)().resolved()
    return _class(name)()


@pytest.mark.parametrize("name", sorted(n for n, s in SECTIONS.items() if any(src.env for src in s.values())))
def test_the_objects_take_their_environment_through_the_table(name: str, environment: dict[str, Any]) -> None:
    made = _made(name)
    for field, src in SECTIONS[name].items():
        if src.env:
            want = _expected(src, environment)
            assert getattr(made, field) == want, f"{name}.{field} from {VARIABLES[src.env].env}"
            assert want != _expected(src, {src.env: getattr(Settings(), src.env)}), "RAW holds the default"
    assert derive(name) == {f: getattr(made, f) for f, src in SECTIONS[name].items() if src.env}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_defaults_read_from_the_environment_are_the_settings_defaults(name: str, monkeypatch) -> None:
    for var in VARIABLES.values():
        monkeypatch.delenv(var.env, raising=False)
    cls, defaults = _class(name), Settings()
    for f in dataclasses.fields(cls):
        src = SECTIONS[name][f.name]
        if src.env and f.default is not dataclasses.MISSING:
            assert f.default == _expected(src, {src.env: getattr(defaults, src.env)}), f"{name}.{f.name}"
    assert derive(name, defaults) == {f: _expected(src, {src.env: getattr(defaults, src.env)})
                                      for f, src in SECTIONS[name].items() if src.env}


def test_options_are_the_backends() -> None:
    from ks_inductor.compiler.backend import option_names

    assert sorted(src.option for src in SECTIONS["BackendOptions"].values() if src.option) == sorted(option_names())


def _command_flags() -> set[str]:
    from ks_inductor.cli.main import build_parser

    out: set[str] = set()

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sub in a.choices.items():
                    walk(sub, (*path, n))
            out.update(" ".join((*path, o)) for o in a.option_strings)

    walk(build_parser(), ())
    return out


def test_flags_and_links_name_what_exists() -> None:
    flags = _command_flags()
    listed = {f for section in SECTIONS.values() for src in section.values() for f in src.flags}
    assert listed <= flags, f"flags no command takes: {sorted(listed - flags)}"
    links = {v for section in SECTIONS.values() for src in section.values() for v in src.via}
    fields = {f"{name}.{field}" for name, section in SECTIONS.items() for field in section}
    assert links <= fields, f"via names no field: {sorted(links - fields)}"
