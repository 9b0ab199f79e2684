"""Which families match every problem file of the repository (and the classification tests' problems), checked
against a table: the family that wins, every family whose matcher accepts the problem in the order they are tried,
the attributes the winner extracts and the templates (with their variants) that cover it.

``tests/family_table.json`` was written from the classification before the family registry existed; a change to a
matcher or to the order that moves any problem shows here. Where a change is meant, rewrite the table with
``python -m tests.test_family_table`` and review its diff.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "family_table.json"


def plain(v: Any) -> Any:
    """``v`` as JSON: graph nodes by name, references as ``ref:NAME``, tuples as lists."""
    from ks_inductor.seeds.graph import Node, Ref

    if isinstance(v, Node):
        return "node:" + v.name
    if isinstance(v, Ref):
        return "ref:" + v.name
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


# Problems that more than one family's matcher accepts: the order decides their family.
ORDER = {
    "sum_1d": ("        return xs[0].sum(dim=0)", "[torch.randn(40)]"),
    "rmsnorm_1d": ("        x = xs[0]\n        return x / torch.sqrt(torch.mean(x ** 2, dim=0, keepdim=True) + 1e-5)",
                   "[torch.randn(40)]"),
    "softmax_1d": ("        return torch.softmax(xs[0], dim=0)", "[torch.randn(40)]"),
    "l2_normalize_1d": ("        return xs[0] / torch.norm(xs[0], p=2, dim=0, keepdim=True)", "[torch.randn(40)]"),
    "mean_all": ("        return xs[0].mean()", "[torch.randn(40)]"),
}


def problems() -> Iterator[tuple[str, Callable[[], Any]]]:
    """(key, loader) for every problem file under tests/problems and the catalogue's problems/, every problem by
    family (``FAMILY_PROBLEMS``), and the problems above."""
    from ks_inductor.catalogue.families import FAMILY_PROBLEMS
    from ks_inductor.catalogue.sources import module
    from ks_inductor.problem_tracing import load_problem, problem_from_source

    for folder in ("tests/problems", "ks_inductor/catalogue/problems"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), lambda path=path: load_problem(path)
    for name, (src, _) in FAMILY_PROBLEMS.items():
        yield "FAMILY:" + name, lambda src=src, name=name: problem_from_source(src, name=name)
    for name, (forward, inputs) in ORDER.items():
        src = module(forward, inputs)
        yield "ORDER:" + name, lambda src=src, name=name: problem_from_source(src, name=name)


def row(problem: Any) -> dict[str, Any]:
    """What the table records for one problem."""
    from ks_inductor.seeds.families import classify, generic_match, matching, templates_for
    from ks_inductor.seeds.graph import parse_graph

    fm = classify(problem)
    r: dict[str, Any] = {"matches": [name for _, name, _ in matching(parse_graph(problem.graph_text))],
                         "family": fm.family if fm else None}
    if fm is None:
        g = generic_match(problem)
        r["generic"] = g.family if g else None
        return r
    r["attrs"] = plain(fm.attrs)
    r["templates"] = {t.name: t.variants(fm) for t in templates_for(fm)}
    return r


def table() -> dict[str, dict[str, Any]]:
    out = {}
    for key, load in problems():
        try:
            problem = load()
        except Exception as e:  # noqa: BLE001
            out[key] = {"error": type(e).__name__}
            continue
        out[key] = row(problem)
    return out


_PROBLEMS = dict(problems())


@pytest.mark.parametrize("key", list(_PROBLEMS))
def test_problem_keeps_its_family(key: str) -> None:
    expected = json.loads(TABLE.read_text())[key]
    try:
        problem = _PROBLEMS[key]()
    except Exception as e:  # noqa: BLE001
        assert expected == {"error": type(e).__name__}
        return
    assert row(problem) == expected


def test_table_lists_every_problem() -> None:
    assert set(json.loads(TABLE.read_text())) == set(_PROBLEMS)


if __name__ == "__main__":
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
