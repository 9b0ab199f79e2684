"""Structural operators: each renders a child that the real judge (interpreter backend) accepts on ragged shapes; the
judge's feedback (room to the floor, rows against row length, programs against SMs, memory- or compute-bound)
decides which one the embedded mutator draws; a search records the operators in its steps, and the trajectory
export and the LLM's prompt name them with their gains."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from kernel_cache.store import KernelStore
from ks_inductor.candidate import Candidate
from ks_inductor.catalogue.attention import DECODE
from ks_inductor.catalogue.families import FAMILY_PROBLEMS, ROWS11
from ks_inductor.catalogue.sources import module, norm_module, small_problem
from ks_inductor.evolve.archive import Archive, Program
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
from ks_inductor.evolve.operators import (
    OPERATORS,
    Feedback,
    OperatorRecord,
    feedback_for,
    history,
    operator_named,
    ranked,
)
from ks_inductor.evolve.prompts import build_messages
from ks_inductor.problem_tracing import problem_from_source
from ks_inductor.seeds.families import classify, seed_templates, template_named, templates_for

LINEAR_GELU = module("        return F.gelu(self.lin(xs[0]), approximate='tanh')", "[torch.randn(40, 24)]",
                     "        self.lin = nn.Linear(24, 56)")
# Decode attention over 101 keys: slices of 64 leave the second one ragged.
DECODE101 = DECODE.format(B=2, T=1, P=100, NH=4, KV=2, D=16, dtype="float32", extra="")
# Windows of 3 rows at stride 1 overlap: a strip of output rows shares its input rows.
POOL = module("        return F.max_pool2d(xs[0], 3, stride=1, padding=1)", "[torch.randn(1, 2, 7, 9)]")

SOURCES = {"rows11": ROWS11, "linear_gelu": LINEAR_GELU, "decode101": DECODE101, "pool": POOL,
           **{n: FAMILY_PROBLEMS[n][0] for n in ("group_norm_affine", "linear3d_residual", "bias_gelu", "mse_loss")}}

# Per operator: the problem, the parent (template, variant, parameters over the variant's CPU defaults) and the
# child's (template, variant); None for a variant the operator may pick among several.
CASES = {
    "split_reduction": ("group_norm_affine", ("inductor", "inductor", {}), ("group_norm", "split")),
    "finalize_stats": ("group_norm_affine", ("group_norm", "split", {"BLOCK": 64, "ITERS": 1, "num_warps": 1}),
                       ("group_norm", "finalize")),
    "split_k": ("linear3d_residual", ("matmul", "tiled", {"BLOCK_K": 16}), ("matmul", "splitk")),
    "split_kv": ("decode101", ("attention", "direct", {"BLOCK_N": 16}), ("attention", "split")),
    "merge_splits": ("decode101", ("attention", "split", {"BLOCK_N": 16, "SPLIT": 64}), ("attention", "direct")),
    "one_pass": ("softmax_bf16", ("softmax_online", "online", {}), ("rowwise", "block")),
    "looped_reduction": ("cross_entropy_fp32", ("cross_entropy", "onepass", {}), ("cross_entropy", None)),
    "persistent": ("rows11", ("rowwise", "block", {"ROWS": 2}), ("rowwise", "persistent")),
    "prefetch": ("rows11", ("rowwise", "block", {"ROWS": 2}), ("rowwise", "prefetch")),
    "rows_per_program": ("rows11", ("rowwise", "block", {"ROWS": 1, "num_warps": 1}), ("rowwise", "block")),
    "flat_grid": ("bias_gelu", ("pointwise", "persistent", {"BLOCK": 256}), ("pointwise", "flat")),
    "tma_loads": ("linear_gelu", ("matmul", "tiled", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}),
                  ("matmul", "tma")),
    "window_reuse": ("pool", ("pool", "flat", {}), ("pool", "window")),
    "merge_kernels": ("cross_entropy_fp32", ("inductor", "inductor", {}), ("cross_entropy", None)),
    "row_stats": ("cross_entropy_fp32", ("cross_entropy", "online", {}), ("cross_entropy", "online_block")),
    "reverse_sweep": ("softmax_bf16", ("softmax_online", "online", {"BLOCK": 16}), ("softmax_online", "online_tail")),
    "variant": ("mse_loss", ("total", "strided", {}), ("total", "chunked")),
}


def _problem(name: str):
    if name in SOURCES:
        return problem_from_source(SOURCES[name], name=name)
    return small_problem(name)


def _fm(problem, target: str = "cpu"):
    fm = classify(problem)
    assert fm is not None
    fm.target = target
    return fm


def _parent(fm, template: str, variant: str, params: dict) -> Candidate:
    if template == "inductor":  # a stand-in: the operators read its template and variant, not its code
        return Candidate("# Inductor's kernels\n", template="inductor", variant=variant)
    t = template_named(template)
    p = {**t.default(fm, variant, fm.target), **params}
    return Candidate(t.render(fm, p, variant), params=p, template=template, variant=variant)


def test_every_operator_is_named_and_covered() -> None:
    assert len(OPERATORS) >= 6 + 1 and set(CASES) == set(OPERATORS)
    for op in OPERATORS.values():
        assert op.what and "\n" not in op.what and operator_named(op.name) is op


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_child_is_accepted_on_ragged_shapes(judge, name: str) -> None:
    pname, (tname, variant, params), (want_t, want_v) = CASES[name]
    problem = _problem(pname)
    fm = _fm(problem)
    parent = _parent(fm, tname, variant, params)
    op = operator_named(name)
    templates = templates_for(fm)
    assert op.applies(parent, fm, templates)
    child = op.apply(parent, fm, random.Random(0), templates, feedback_for(fm))
    assert (child.template, child.mutation, child.parent_id) == (want_t, name, parent.id)
    assert child.variant == want_v if want_v else child.variant != variant
    assert child.source != parent.source
    if name == "split_k":  # K 40 in tiles of 16: three tiles, cut in at least two slices
        assert 2 <= child.params["SPLIT_K"] <= 3
    if name == "split_kv":
        assert -(-101 // child.params["SPLIT"]) >= 2
    if name == "rows_per_program":
        assert child.params["ROWS"] > 1
    r = judge.evaluate(problem, child.source)
    assert r.accepted, (name, child.template, child.variant, child.params, r.verdict, r.reasons[:2], r.error)


def test_operators_do_not_apply_where_the_family_lacks_the_structure() -> None:
    fm = _fm(_problem("rows11"))
    block = _parent(fm, "rowwise", "block", {"ROWS": 2})
    names = {op.name for op, _ in ranked(block, fm, Feedback(), templates_for(fm))}
    assert names.isdisjoint({"split_k", "split_kv", "split_reduction", "window_reuse", "tma_loads", "one_pass"})
    # A GEMM too tall for split-K is offered none.
    tall = _fm(problem_from_source(module("        return xs[0] @ xs[1]", "[torch.randn(600, 8), torch.randn(8, 8)]"),
                                   name="tall"))
    assert not operator_named("split_k").applies(_parent(tall, "matmul", "tiled", {}), tall, templates_for(tall))


# Per operator: feedback that calls for it, and feedback that does not.
CALLS = {
    "split_reduction": (Feedback(rows=8, row_len=65536), Feedback(rows=4096, row_len=64)),
    "split_k": (Feedback(rows=8, row_len=4096, programs=64), Feedback(rows=4096, row_len=4096, programs=4096)),
    "split_kv": (Feedback(rows=2, row_len=4096), Feedback(rows=1024, row_len=4096)),
    "merge_splits": (Feedback(programs=1024), Feedback(programs=8)),
    "one_pass": (Feedback(row_len=4096, bound="memory"), Feedback(row_len=262144, bound="memory")),
    "looped_reduction": (Feedback(row_len=131072), Feedback(row_len=512)),
    "persistent": (Feedback(programs=65536), Feedback(programs=16)),
    "flat_grid": (Feedback(programs=16), Feedback(programs=65536)),
    "prefetch": (Feedback(row_len=32768, bound="memory"), Feedback(row_len=64, bound="memory")),
    "rows_per_program": (Feedback(rows=65536, row_len=128, params={"ROWS": 1}),
                         Feedback(rows=16, row_len=16384, params={"ROWS": 1})),
    "finalize_stats": (Feedback(row_len=1 << 20, params={"BLOCK": 1024, "ITERS": 1}),
                       Feedback(row_len=1024, params={"BLOCK": 1024, "ITERS": 1})),
    "tma_loads": (Feedback(bound="compute", roofline_fraction=0.3), Feedback(bound="memory")),
    "merge_kernels": (Feedback(params={"K0_XBLOCK": 1, "K1_XBLOCK": 1, "K1_R0_BLOCK": 2048}),
                      Feedback(params={"K0_XBLOCK": 1, "K0_R0_BLOCK": 2048})),
    "row_stats": (Feedback(row_len=32768), Feedback(row_len=512)),
    "window_reuse": (Feedback(attrs={"nd": 2, "kernel": [3, 3], "dilation": [1, 1], "stride": [1, 1]}),
                     Feedback(attrs={"nd": 2, "kernel": [2, 2], "dilation": [1, 1], "stride": [2, 2]})),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_feedback_calls_for_an_operator(name: str) -> None:
    op = operator_named(name)
    calls, not_calls = CALLS[name]
    assert op.score(calls) >= 0.8 and op.score(not_calls) <= 0.3, (op.score(calls), op.score(not_calls))


def test_few_long_groups_far_from_the_floor_get_split_reduction() -> None:
    few_long = _fm(problem_from_source(norm_module("nn.GroupNorm(4, 8)", "[torch.randn(2, 8, 64, 64)]"), name="gn"),
                   "cuda")
    parent = _parent(few_long, "inductor", "inductor", {})
    prog = Program("p", "h", parent.to_json(), {}, 0, True, True, speedups=[1.0],
                   metrics={"roofline_fraction": 0.2})
    fb = feedback_for(few_long, prog, {"sm_count": 132})
    assert fb.few_long_rows and fb.far_from_floor and (fb.rows, fb.row_len) == (8, 8192)
    (top, w), *rest = ranked(parent, few_long, fb, templates_for(few_long))
    assert top.name == "split_reduction" and all(w > 2 * x for _, x in rest)
    many_short = _fm(problem_from_source(norm_module("nn.GroupNorm(4, 8)", "[torch.randn(512, 8, 2, 2)]"),
                                         name="gn_short"), "cuda")
    fb_short = feedback_for(many_short, prog, {"sm_count": 132})
    assert not fb_short.few_long_rows
    assert dict(ranked(parent, many_short, fb_short, templates_for(many_short)))[top] < w / 3


def _draws(mut: EmbeddedMutator, parent: Program, n: int = 160) -> Counter:
    rng = random.Random(7)
    out: Counter = Counter()
    for _ in range(n):
        m = mut.mutate(parent, rng)
        assert m.candidate is not None, m.error
        assert m.operator == m.kind == m.candidate.mutation
        out[m.kind] += 1
    return out


def _gemm(rows: int, k: int, n: int):
    src = module("        return self.lin(xs[0])", f"[torch.randn({rows}, {k})]",
                 f"        self.lin = nn.Linear({k}, {n}, bias=False)")
    return _fm(problem_from_source(src, name=f"gemm{rows}x{k}x{n}"), "cuda")


def test_the_mutator_draws_operators_by_the_judges_feedback() -> None:
    # A decode GEMM (8 rows): few output tiles, a long K. Far from its floor, steps are structural more often, and
    # split-K is the structural step drawn most.
    skinny = _gemm(8, 4096, 4096)
    mut = EmbeddedMutator(skinny, inductor=False)
    seed = next(c for c in mut.seeds() if c.variant == "tiled")

    def parent(fraction: float) -> Program:
        return Program(seed.id, seed.source_hash, seed.to_json(), {}, 0, True, True, speedups=[1.0],
                       metrics={"roofline_fraction": fraction})

    far, near = _draws(mut, parent(0.2)), _draws(mut, parent(0.95))
    structural = lambda c: sum(v for k, v in c.items() if k != "param")  # noqa: E731
    assert structural(far) > 1.5 * structural(near)
    assert max((k for k in far if k != "param"), key=far.__getitem__) == "split_k", far
    # A square compute-bound GEMM far from its floor: no split-K on offer; TMA loads are drawn most.
    square = _gemm(2048, 2048, 2048)
    mut = EmbeddedMutator(square, inductor=False)
    seed = next(c for c in mut.seeds() if c.variant == "tiled")
    drawn = _draws(mut, parent(0.2))
    assert "split_k" not in drawn and max((k for k in drawn if k != "param"), key=drawn.__getitem__) == "tma_loads"


def test_operator_history_and_the_llm_prompt_name_the_gains() -> None:
    archive = Archive(islands=1)
    seed = Candidate("seed = 0\n", template="matmul", variant="tiled")
    child = Candidate("child = 1\n", template="matmul", variant="splitk", parent_id=seed.id, mutation="split_k")
    wrong = Candidate("wrong = 2\n", template="matmul", variant="tma", parent_id=seed.id, mutation="tma_loads")
    for c, correct, speed in ((seed, True, 1.0), (child, True, 1.25), (wrong, False, None)):
        archive.add(Program(c.id, c.source_hash, c.to_json(), {"block": "S"}, 0, correct, speed is not None,
                            speedups=[speed] if speed else []))
    tried = history(archive)
    assert tried["split_k"].best_gain == pytest.approx(1.25) and tried["split_k"].correct == 1
    assert (tried["tma_loads"].tries, tried["tma_loads"].correct, tried["tma_loads"].best_gain) == (1, 0, None)
    assert "seed" not in tried
    msgs = build_messages("class Model: pass", "info", {"device": "H100"}, "# parent", {"roofline_fraction": 0.4},
                          1.0, "", [], tried=tried)
    text = msgs[-1]["content"]
    assert "40.0% of its roofline floor" in text and "at most 2.50x faster" in text
    assert "- split_k: 1 children, 1 correct, best gain 1.250x" in text and "- tma_loads: 1 children, 0 correct" in text
    # Without a measured floor or any step tried, neither section is there.
    bare = build_messages("class Model: pass", "info", {}, "# parent", {}, None, "", [])[-1]["content"]
    assert "# Room" not in bare and "already tried" not in bare


def test_a_search_records_operators_and_the_export_shows_them(judge, tmp_path, monkeypatch, capsys) -> None:
    from ks_inductor.cli import main
    from ks_inductor.evolve import EvolveConfig, evolve_problem
    from ks_inductor.evolve import evolver as evolver_module
    from ks_inductor.training import export_trajectories, to_rows

    # One seed (the one-block row-wise kernel) and every step structural where an operator applies, so that each
    # child of the short search is an operator's.
    seeds = EmbeddedMutator.seeds
    monkeypatch.setattr(EmbeddedMutator, "seeds", lambda self, ctx=None: seeds(self, ctx)[:1])
    monkeypatch.setattr(evolver_module, "EmbeddedMutator",
                        lambda fm, inductor=True: EmbeddedMutator(fm, variant_prob=1.0, inductor=inductor))
    problem = small_problem("softmax_bf16")
    db = f"sqlite:///{tmp_path}/k.db"
    store = KernelStore(db)
    cfg = EvolveConfig(budget=4, islands=1, parallel=1, seed=0, inductor_seeds=False, final_candidates=0)
    summary = evolve_problem(problem, cfg, store, judge=judge, progress=False)
    steps = store.steps(run_id=summary.run_id)
    assert [s.mutation for s in steps][0] == "seed" and len(steps) == 4
    # Every child's line from the seed ends in the step the search recorded for it; untimed, no move won.
    from ks_inductor.evolve.lineage import lineage

    archive = Archive.from_json(store.load_run_state(summary.run_id)["archive"])
    for s in steps[1:]:
        line = lineage(archive, s.child_id)
        assert line and (line[-1].operator, line[-1].parent_id, line[-1].child_id) == (s.mutation, s.parent_id,
                                                                                         s.child_id)
        assert all(st.gain is None for st in line)
    recorded = {(s.mutation, s.parent_id, s.child_id) for s in steps}
    assert all((st["operator"], st["parent_id"], st["child_id"]) in recorded for st in summary.lineage)
    assert summary.winning_move is None
    children = steps[1:]
    assert all(s.mutation in OPERATORS and s.parent_id and s.child_id and s.verdict == "accepted" for s in children)
    assert len({s.mutation for s in children}) >= 2
    assert all(s.gain is None for s in steps)  # the interpreter times nothing: no gain is claimed
    rows = to_rows(children, "sft", {problem.key: problem})
    assert [(r["operator"], r["parent_id"], r["child_id"]) for r in rows] == [
        (s.mutation, s.parent_id, s.child_id) for s in children]
    stats = export_trajectories(store, "sft", tmp_path / "t.jsonl", min_gain=0.0)
    assert stats.rows == 0  # untimed steps are no training rows
    for s in children:
        assert stats.operators[s.mutation].steps >= 1
    assert json.loads(json.dumps(stats.to_json()))["operators"]
    store.close()
    assert main(["export-trajectories", "--db", db, "-o", str(tmp_path / "t2.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "steps by operator:" in err and all(s.mutation in err for s in children)


def test_a_timed_step_records_its_gain(tmp_path) -> None:
    from kernel_cache.record import StepRecord
    from kernel_cache.testing import h200

    store = KernelStore(f"sqlite:///{tmp_path}/k.db")
    problem = small_problem("rmsnorm_bf16")
    store.upsert_problem(problem)
    run = store.start_run(problem.key, h200(), {})
    store.add_step(StepRecord(run_id=run, problem_key=problem.key, child_id="c", mutation="split_k", parent_id="p",
                              correct=True, verdict="accepted", parent_speedup=1.0, child_speedup=1.2, gain=1.2))
    (step,) = store.steps(run_id=run)
    assert (step.mutation, step.parent_id, step.child_id, step.gain) == ("split_k", "p", "c", 1.2)
    store.close()


def test_operator_record_counts() -> None:
    rec = OperatorRecord()
    rec.add(True, 1.1)
    rec.add(False, None)
    rec.add(True, 0.9)
    assert rec.to_json() == {"tries": 3, "correct": 2, "best_gain": 1.1}


def test_a_search_seeds_the_best_guesses_and_leaves_the_other_variants_to_operators() -> None:
    from ks_inductor.evolve.operators import seeded_variants

    # Softmax: the one-block row kernel is seeded; a persistent grid, prefetching and the chunked online sweep are
    # each one named step from it.
    fm = _fm(small_problem("softmax_bf16"))
    templates = templates_for(fm)
    assert [(t.name, v) for t, v in seeded_variants(fm, templates)] == [("rowwise", "block")]
    seed = _parent(fm, "rowwise", "block", {})
    reached = {(t.name, v): op.name for op in OPERATORS.values() if op.name != "variant"
               for t, v in op.targets(seed, fm, templates)}
    assert reached == {("rowwise", "persistent"): "persistent", ("rowwise", "prefetch"): "prefetch",
                       ("softmax_online", "online"): "looped_reduction"}
    # Group norm: Inductor's kernel is the seed; its looped form is looped_reduction's step from it, the split
    # kernel split_reduction's, and the finalize pass finalize_stats' from that.
    gn = _fm(_problem("group_norm_affine"))
    gn_templates = seed_templates(gn)
    assert [t.name for t in gn_templates] == ["inductor", "group_norm"]
    assert [(t.name, v) for t, v in seeded_variants(gn, gn_templates)] == [("inductor", "inductor")]
    # With Inductor's kernel seeded, the row kernels are its operators' steps too: several rows a tile, a
    # persistent grid, prefetching, and the online sweep.
    sm_templates = seed_templates(fm)
    assert [(t.name, v) for t, v in seeded_variants(fm, sm_templates)] == [("inductor", "inductor")]
    inductor = Candidate("# Inductor's kernels\n", template="inductor", variant="inductor")
    from_inductor = {(t.name, v): op.name for op in OPERATORS.values() if op.name != "variant"
                     for t, v in op.targets(inductor, fm, sm_templates)}
    assert from_inductor == {("rowwise", "block"): "rows_per_program", ("rowwise", "persistent"): "persistent",
                             ("rowwise", "prefetch"): "prefetch", ("softmax_online", "online"): "looped_reduction",
                             ("inductor", "looped"): "looped_reduction"}
    child = operator_named("rows_per_program").apply(inductor, fm, random.Random(0), sm_templates)
    assert (child.template, child.variant, child.mutation) == ("rowwise", "block", "rows_per_program")
    # The total reduction's chunked variant, which no named operator makes, stays a seed of its own.
    mse = _fm(_problem("mse_loss"))
    assert [(t.name, v) for t, v in seeded_variants(mse, templates_for(mse))] == [("total", "strided"),
                                                                                 ("total", "chunked")]


def test_an_untried_operator_makes_the_step_structural() -> None:
    fm = _fm(small_problem("softmax_bf16"), "cuda")
    mut = EmbeddedMutator(fm, inductor=False)
    seed = mut.seeds()[0]
    parent = Program(seed.id, seed.source_hash, seed.to_json(), {}, 0, True, True, speedups=[1.0],
                     metrics={"roofline_fraction": 0.95})
    near = mut.structural_chance(mut.feedback(parent))
    assert near < 0.25 and mut.structural_chance(mut.feedback(parent), untried=True) >= 0.75

    class Ctx:
        archive = Archive(islands=1)
        hardware: dict = {}

    Ctx.archive.add(parent)
    rng = random.Random(3)
    kinds = Counter(mut.mutate(parent, rng, Ctx()).kind for _ in range(40))
    assert sum(v for k, v in kinds.items() if k != "param") >= 20, kinds


def test_lineage_names_the_winning_move() -> None:
    from ks_inductor.evolve.lineage import lineage, winning_move

    archive = Archive(islands=1)
    seed = Candidate("seed = 0\n", template="matmul", variant="tiled", mutation="seed")
    split = Candidate("split = 1\n", template="matmul", variant="splitk", parent_id=seed.id, mutation="split_k")
    tuned = Candidate("tuned = 2\n", template="matmul", variant="splitk", parent_id=split.id, mutation="param")
    for c, speed in ((seed, 0.9), (split, 1.35), (tuned, 1.4)):
        archive.add(Program(c.id, c.source_hash, c.to_json(), {"block": c.source}, 0, True, True, speedups=[speed]))
    steps = lineage(archive, tuned.id)
    assert [(s.operator, s.parent_id, s.child_id) for s in steps] == [("split_k", seed.id, split.id),
                                                                      ("param", split.id, tuned.id)]
    won = winning_move(steps)
    assert won is not None and won.operator == "split_k" and won.gain == pytest.approx(1.5)
    assert lineage(archive, seed.id) == [] and winning_move([]) is None
    # Untimed steps claim no gain, so nothing won.
    assert winning_move([s.__class__(s.operator, s.parent_id, s.child_id, None) for s in steps]) is None


def test_evolve_prints_the_winners_line_and_winning_move() -> None:
    from rich.console import Console

    from kernel_cache.record import KernelRecord
    from ks_inductor.cli.evolve import print_summary
    from ks_inductor.evolve.evolver import EvolveSummary

    best = KernelRecord(problem_key="k", source="", backend="triton-cuda", fingerprint={}, status="verified",
                        timed=True, median_ms=0.138)
    s = EvolveSummary(problem_key="k", best=best, best_result=None, judged=21, accepted=18, wall_s=200.0, run_id="r",
                      seed_speedup=1.0, best_speedup=2.18, timed=True,
                      lineage=[{"operator": "persistent", "parent_id": "a", "child_id": "b", "gain": 2.174},
                               {"operator": "param", "parent_id": "b", "child_id": "c", "gain": None}],
                      winning_move={"operator": "persistent", "parent_id": "a", "child_id": "b", "gain": 2.174})
    console = Console(record=True, width=200)

    class P:
        name = "softmax_bf16"

    print_summary(console, P(), s)
    text = console.export_text()
    assert "persistent 2.17x → param" in text and "persistent (2.17x over its parent)" in text
