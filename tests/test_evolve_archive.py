"""The archive's rules (displacement by confidence bound, untimed first-correct, selection, migration, resume
state) and the embedded mutator's moves, without a judge."""

from __future__ import annotations

import json
import random

from ks_inductor.candidate import Candidate
from ks_inductor.catalogue.sources import small_problem
from ks_inductor.evolve.archive import Archive, Program, cell_key
from ks_inductor.evolve.diffs import DiffError, apply_blocks, apply_response, make_blocks, parse_blocks
from ks_inductor.evolve.mutators.base import describe_source
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
from ks_inductor.evolve.operators import OPERATORS
from ks_inductor.seeds.families import classify, template_named

DESC = {"block": "M", "warps": 4, "stages": 1, "dot": False, "fusion": 1.0, "persistent": False}


def prog(pid: str, speed: float | None, lcb: float | None = None, correct: bool = True, timed: bool = True,
         desc: dict | None = None, island: int = 0) -> Program:
    return Program(id=pid, source_hash=pid * 4, candidate=Candidate(f"# {pid}").to_json(), descriptor=desc or DESC,
                   island=island, correct=correct, timed=timed, speedups=[speed] if speed else [],
                   lcbs=[lcb if lcb is not None else speed] if speed else [])


def test_child_displaces_only_when_its_lower_bound_clears_the_margin() -> None:
    a = Archive(islands=1, margin=0.02, elite_size=1)
    assert a.add(prog("inc", 1.50, 1.45))
    assert not a.add(prog("noisy", 1.60, 1.52))  # faster point estimate, but the LCB is within the margin
    assert a.cells[0][cell_key(DESC)] == "inc"
    assert a.add(prog("real", 1.70, 1.56))  # 1.56 > 1.50 * 1.02
    assert a.cells[0][cell_key(DESC)] == "real"
    assert a.best().id == "real"


def test_untimed_keeps_the_first_correct_program_per_cell() -> None:
    a = Archive(islands=1)
    a.add(prog("bad", None, correct=False, timed=False))
    assert cell_key(DESC) not in a.cells[0]
    assert a.add(prog("first", None, timed=False))
    a.add(prog("second", None, timed=False))
    assert a.cells[0][cell_key(DESC)] == "first"


def test_retiming_moves_scores_to_the_median_and_demotion_removes() -> None:
    a = Archive(islands=1)
    a.add(prog("x", 2.0, 1.9))
    a.add(prog("y", 1.8, 1.7, desc={**DESC, "warps": 8}))
    assert a.best().id == "x"
    a.update_measurement("x", 1.5, 1.4, 0.1)
    a.update_measurement("x", 1.6, 1.5, 0.1)
    assert a.programs["x"].score == 1.6 and a.best().id == "y"
    a.demote("y")
    assert a.best().id == "x" and "y" not in a.cells[0].values()


def test_selection_migration_and_json_round_trip() -> None:
    a = Archive(islands=2, migration_interval=2)
    a.add(prog("p0", 1.2, island=0))
    a.add(prog("p1", 1.1, island=1, desc={**DESC, "block": "L"}))
    rng = random.Random(0)
    picks = {a.select_parent(0, rng).id for _ in range(50)}
    assert picks <= {"p0", "p1"} and "p0" in picks
    assert not a.step_island(0) and a.step_island(0)
    assert a.migrate(0) == ["p0"] and "p0" in a.cells[1].values()
    assert a.migrate(0) == []  # never migrated twice
    insp = a.inspirations(a.programs["p0"], 2, rng)
    assert [p.id for p in insp] == ["p1"]
    b = Archive.from_json(json.loads(json.dumps(a.to_json())))
    assert b.best().id == a.best().id and b.cells == a.cells and b.is_seen("p0" * 4)


def test_embedded_mutator_moves_params_within_the_space_and_applies_operators() -> None:
    fm = classify(small_problem("softmax_bf16"))
    mut = EmbeddedMutator(fm, inductor=False)  # the family templates' seeds and moves
    seeds = mut.seeds()
    # The one-block row kernel is the seed; the other variants are operators' steps from it.
    assert {(c.template, c.variant) for c in seeds} == {("rowwise", "block")}
    parent = Program(id="s", source_hash=seeds[0].source_hash, candidate=seeds[0].to_json(),
                     descriptor=mut.descriptor(seeds[0]), island=0, correct=True, timed=False)
    rng = random.Random(1)
    kinds, hashes = set(), set()
    for _ in range(40):
        m = mut.mutate(parent, rng)
        assert m.candidate is not None and m.error is None
        c = m.candidate
        t = template_named(c.template)
        space = t.space(fm, c.variant)
        assert all(c.params[k] in space[k] for k in space)
        assert m.diff.startswith("---") and c.parent_id == "s"
        kinds.add(m.kind)
        hashes.add(c.source_hash)
    # Structural steps are the operators' that apply to the one-block row kernel (a persistent grid, prefetching,
    # the chunked online softmax), each named.
    assert "param" in kinds and kinds - {"param"} and kinds - {"param"} <= set(OPERATORS), kinds
    assert len(hashes) > 10


def test_embedded_mutator_tweaks_code_no_template_wrote() -> None:
    src = "import triton\nk[(1,)](x, BLOCK=128, num_warps=4)\n"
    parent = Program(id="l", source_hash="h", candidate=Candidate(src, mutation="llm-seed").to_json(),
                     descriptor=describe_source(src), island=0, correct=True, timed=False)
    m = EmbeddedMutator(None).mutate(parent, random.Random(0))
    assert m.candidate is not None and m.candidate.source != src and m.kind == "tweak"


def test_edit_blocks_apply_strictly() -> None:
    parent = "a = 1\nb = 2\nc = 3\n"
    child = "a = 1\nb = 20\nc = 3\n"
    text = make_blocks(parent, child)
    assert apply_blocks(parent, parse_blocks(text)) == child
    for bad in ("<<<<<<< SEARCH\nb = 5\n=======\nb = 6\n>>>>>>> REPLACE",
                "<<<<<<< SEARCH\nb = 2\n=======\nb = 2\n>>>>>>> REPLACE", "no edits here"):
        try:
            apply_response(parent, bad)
        except DiffError as e:
            assert str(e)
        else:
            raise AssertionError(f"applied {bad!r}")
    rewrite = "```python\nclass ModelNew:\n    pass\n```"
    assert apply_response(parent, rewrite)[1] == "llm-rewrite"


def test_make_blocks_round_trips_nearby_and_random_edits() -> None:
    import random

    parent = "".join(f"line{i}\n" for i in range(20))
    child = parent.replace("line5\n", "LINE5\n").replace("line7\n", "LINE7\n")  # context windows overlap
    assert apply_response(parent, make_blocks(parent, child))[0] == child
    rng = random.Random(0)
    for _ in range(200):
        lines = [f"x{rng.randrange(6)} = {rng.randrange(4)}\n" for _ in range(25)]
        edited = list(lines)
        for _ in range(rng.randrange(1, 5)):
            k = rng.randrange(len(edited))
            r = rng.random()
            if r < 0.4:
                edited[k] = f"y{rng.randrange(9)} = 1\n"
            elif r < 0.7:
                edited.insert(k, f"z{rng.randrange(9)} = 2\n")
            else:
                edited.pop(k)
        p, c = "".join(lines), "".join(edited)
        if p != c:
            assert apply_response(p, make_blocks(p, c))[0] == c
