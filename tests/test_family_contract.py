"""What every op family owes, checked on the problems its test file declares.

A family's test file, ``tests/test_<family>_family.py``, holds ``PROBLEMS``: ``{name: (problem source, the family
the problem must classify as, or None where every family must decline it)}``. Each of them is checked here: its
classification, and for a problem the family takes, every variant of every template covering it on both targets
(defaults inside the search space, a render the judge's static rules accept). The same problems are compiled for
sm_90 (``tests/test_templates_cuda_compile.py``) and run on NaN by ``benchmarks/nan_probe.py``; judging the renders
is the family test file's own work. A registered family with no test problem anywhere fails here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from ks_inductor.judge.static_checks import static_check
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import FAMILIES, Family, classify, family_of, register, templates_for

ROOT = Path(__file__).resolve().parent.parent


def family_test_problems() -> dict[str, tuple[str, str | None]]:
    """``PROBLEMS`` of every ``tests/test_*_family.py``, merged (a name may be declared once)."""
    out: dict[str, tuple[str, str | None]] = {}
    for path in sorted((ROOT / "tests").glob("test_*_family.py")):
        for name, case in getattr(importlib.import_module(f"tests.{path.stem}"), "PROBLEMS", {}).items():
            assert name not in out, f"test problem {name!r} is declared twice"
            out[name] = case
    return out


CASES = family_test_problems()
TAKEN = sorted(n for n, (_, family) in CASES.items() if family is not None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_problem_classifies_as_declared(name: str) -> None:
    src, expected = CASES[name]
    assert family_of(problem_from_source(src, name=name)) == expected


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name", TAKEN)
def test_every_variant_renders_within_its_space(name: str, target: str) -> None:
    """The mutator moves parameters from the defaults within the space, and every seed must get past the judge's
    static rules before it costs a judgment."""
    fm = classify(problem_from_source(CASES[name][0], name=name))
    fm.target = target
    templates = templates_for(fm)
    assert templates, f"no template covers {name} ({fm.family})"
    for t in templates:
        for v in t.variants(fm):
            d, space = t.default(fm, v, target), t.space(fm, v)
            assert set(space) <= set(d), (t.name, v, set(space) - set(d))
            assert all(d[k] in vals for k, vals in space.items()), (t.name, v)
            src = t.render(fm, d, v)
            assert static_check(src) == [], (t.name, v, static_check(src))


def test_every_family_has_test_problems() -> None:
    """Each registered family (the generic one aside) is the declared family of some test problem: one of a
    family test file, of the classification tests (``EXTRA``) or of a problem file (``tests/family_table.json``)."""
    from tests.test_evolve_families import EXTRA

    table = json.loads((ROOT / "tests" / "family_table.json").read_text())
    declared = {f for _, f in CASES.values()} | {f for _, f in EXTRA.values()} | {r.get("family") for r in table.values()}
    untested = [fam.name for fam in FAMILIES.values() if not fam.generic and not set(fam.names) & declared]
    assert not untested, f"families without a test problem: {untested}"


def test_registry_refuses_clashes() -> None:
    """The order rests on the priorities alone, and a template or a match name belongs to one family."""
    before = list(FAMILIES)
    rowwise = FAMILIES["rowwise"]
    for clash in (Family("rowwise", 999, rowwise.match), Family("new", rowwise.priority, rowwise.match),
                  Family("new", 999, rowwise.match, kinds=("softmax",)),
                  Family("new", 999, rowwise.match, templates=rowwise.templates[1:]),
                  Family("new", 999, rowwise.match, templates=rowwise.templates[:1], kinds=("new",))):
        with pytest.raises(ValueError):
            register(clash)
    assert list(FAMILIES) == before

