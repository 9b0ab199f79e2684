"""Judging what templates render: every variant (or the first) of every template covering a problem, rendered and
statically checked, then judged together on the real judge."""

from __future__ import annotations

from ks_inductor.judge.static_checks import static_check
from ks_inductor.seeds.families import classify, templates_for


def renders(problem, all_variants: bool, overrides: dict | None = None):
    fm = classify(problem)
    assert fm is not None
    fm.target = "cpu"
    out = []
    for t in templates_for(fm):
        variants = t.variants(fm) if all_variants else t.variants(fm)[:1]
        for v in variants:
            params = t.default(fm, v, "cpu")
            space = t.space(fm, v)
            params.update({k: val for k, val in (overrides or {}).items() if k in space})
            src = t.render(fm, params, v)
            assert static_check(src) == [], (t.name, v, static_check(src))
            out.append((f"{t.name}/{v}", src))
    return out


def judge_all(judge, jobs_spec) -> None:
    # Render (and statically check) everything before submitting: CPython 3.11 can fail when ast.parse runs in
    # two threads at once, and the judge parses in its own threads.
    rendered = [(name, problem, label, src) for name, problem, all_variants, *over in jobs_spec
                for label, src in renders(problem, all_variants, over[0] if over else None)]
    jobs = [(name, label, judge.submit(problem, src)) for name, problem, label, src in rendered]
    failures = []
    for (name, problem, label, src), (_, _, fut) in zip(rendered, jobs):
        r = fut.result()
        if r.verdict == "error" and (r.error or "").startswith("judge failure"):
            # The judge's own failure (CPython 3.11 can fail ast.parse in concurrent threads), not the kernel's:
            # judged again, as the evolver does.
            r = judge.evaluate(problem, src)
        if not r.accepted:
            failures.append(f"{name} {label}: {r.verdict} {r.reasons[:2]} {r.error}")
    assert not failures, "\n".join(failures)
    assert jobs
