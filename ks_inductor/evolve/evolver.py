"""The evolution loop: seeds, then parent selection, mutation, judgment and archive update, every step recorded.

State lives in the kernel cache (run state, evaluations, steps), so an interrupted run resumes where it stopped;
the verified winner is written to the cache at the end.
"""

from __future__ import annotations

import contextvars
import logging
import random
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from kernel_cache.record import QUARANTINED, RACE, REJECTED, VERIFIED, KernelRecord, StepRecord
from ks_core.problem_record import Problem
from ks_inductor.candidate import Candidate
from ks_inductor.contracts import RoomJudge, SearchJudge, SearchStore
from ks_inductor.evolve.archive import Archive, Program
from ks_inductor.evolve.config import EvolveConfig
from ks_inductor.evolve.lineage import lineage, winning_move
from ks_inductor.evolve.mutators.base import Mutation
from ks_inductor.evolve.mutators.embedded import EmbeddedMutator
from ks_inductor.evolve.prompts import fingerprint_facts
from ks_inductor.judge.room import SETTLE_AT, Room
from ks_inductor.judge.verdict import ACCEPTED, DEADLINE_ERROR, EvalResult
from ks_inductor.seeds.families import FamilyMatch, classify, generic_match

log = logging.getLogger(__name__)


# Until the judge has finished a final judgment (``Judge.typical_cost``), its cost is foreseen from the search's
# own: FINAL_COST times a search judgment's own seconds (the final protocol's longer timing, its steady state and
# Inductor's compile) and FINAL_HELD_COST times the seconds a search judgment holds the device alone (on an H100 a
# small problem's search child holds it 0.15 s, its final judgment about 4 s, the CUDA-graph timing most of that).
# Then the share of a time limit kept for the final judgments (at least, at most), and the least time worth
# starting them in.
FINAL_COST = 5.0
FINAL_HELD_COST = 25.0
FINAL_RESERVE_MIN = 0.15
FINAL_RESERVE_MAX = 0.5
FINAL_MIN_S = 1.0
# With less than this share of the final judgments' estimate left, only the search's best is judged finally (its
# judgment still may fit, and nothing else would use the time).
FINAL_START_SHARE = 0.5
# The final judgment of the search's best may run this share of the time limit past it. A search whose best is
# never judged finally serves nothing: on a crowded device (three regions of a pack build starting together, an
# H200) the final judgments of prefill RMSNorm, RoPE and SiLU-mul kernels 7-10x faster than eager were cut off at
# a 60 s limit in one build of three, and their regions fell back to the model's own code. The other leaders' final
# judgments keep the limit.
FINAL_GRACE_SHARE = 0.5


class EvolveError(Exception):
    """The run cannot start (no template and no LLM, the reference fails, ...); the message says what to do."""


@dataclass
class EvolveSummary:
    problem_key: str
    best: KernelRecord | None
    best_result: EvalResult | None
    judged: int
    accepted: int  # among the ``judged``: verdicts taken from the cache are ``reused``, not counted here
    wall_s: float
    run_id: str
    # The search's score of the best seed and of the winner (EvalResult.score: the speedup over the best baseline,
    # per call and, where the judge timed it, inside a CUDA graph, as a geometric mean).
    seed_speedup: float | None
    best_speedup: float | None
    family: str | None = None
    timed: bool = False
    failed_steps: int = 0
    stop_reason: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    # The final judgment's head-to-head times: per leader after the first (program id), the first leader's speed
    # over it (above 1: the first leader is faster).
    head_to_head: dict[str, float] = field(default_factory=dict)
    # What the run could not do as asked (the final protocol did not fit in the time limit, ...).
    note: str = ""
    # Candidates whose verdict an earlier run had stored (a re-run proposes the same seeds): not judged again.
    reused: int = 0
    # Why no kernel will be served, in one line; empty where a verified kernel was stored (``why_no_kernel``).
    why: str = ""
    # The region's room (``ks_inductor.judge.room.Room.to_json()``) where the judge measured it.
    room: dict[str, Any] | None = None
    # The steps from a seed to the winner (``lineage.LineageStep.to_json()``), and the one that gained most.
    lineage: list[dict[str, Any]] = field(default_factory=list)
    winning_move: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "problem_key": self.problem_key, "best": self.best.to_json() if self.best else None,
            "best_result": self.best_result.to_json() if self.best_result else None, "judged": self.judged,
            "accepted": self.accepted, "wall_s": self.wall_s, "run_id": self.run_id,
            "seed_speedup": self.seed_speedup, "best_speedup": self.best_speedup, "family": self.family,
            "timed": self.timed, "failed_steps": self.failed_steps, "stop_reason": self.stop_reason,
            "tokens": self.tokens, "head_to_head": self.head_to_head, "note": self.note, "reused": self.reused,
            "why": self.why, "room": self.room, "lineage": self.lineage, "winning_move": self.winning_move,
        }


@dataclass
class MutationContext:
    """What a mutator may look at: the problem, the archive, the hardware."""

    problem: Problem
    family: FamilyMatch | None
    archive: Archive
    hardware: dict[str, Any]
    results: dict[str, EvalResult]  # program id -> its latest verdict (for feedback)


def hardware_facts(judge: SearchJudge) -> dict[str, Any]:
    fp = judge.fingerprint
    peaks = judge.backend.nominal_peaks(fp.device_name) if hasattr(judge.backend, "nominal_peaks") else {}
    return fingerprint_facts(fp, peaks)


def _program_from(cand: Candidate, res: EvalResult, descriptor: dict[str, Any], island: int) -> Program:
    timed = bool(res.timing_meaningful)
    speed = res.score
    lcb = res.score_lcb
    ms = res.candidate_ms
    if timed and speed is None and ms:
        speed = lcb = 1.0 / ms  # no baseline measured: rank by time alone
    return Program(
        id=cand.id, source_hash=cand.source_hash, candidate=cand.to_json(), descriptor=descriptor, island=island,
        correct=res.verdict == ACCEPTED and res.correct, timed=timed,
        speedups=[speed] if timed and speed is not None else [], lcbs=[lcb] if timed and lcb is not None else [],
        median_ms=[ms] if ms is not None else [],
        metrics={"speedup_eager": res.speedup_eager, "speedup_inductor": res.speedup_inductor,
                 "steady_speedups": res.steady_speedups, "roofline_fraction": res.roofline_fraction,
                 "verdict": res.verdict},
        feedback=res.feedback_text()[-3000:], generation=cand.generation,
    )


class Evolver:
    def __init__(self, problem: Problem, config: EvolveConfig, store: SearchStore, judge: SearchJudge,
                 progress: Any = True, started: float | None = None) -> None:
        self.problem = problem
        # When the run's time limit started counting (``time.monotonic``): the caller's start, when it set up the
        # judge for this run, else the loop's.
        self.started = started
        self.config = config
        self.store = store
        self.judge = judge
        self.progress = progress
        self.fp = judge.fingerprint
        self.timed = bool(self.fp.timed)
        self.family = classify(problem)
        if self.family is None and config.inductor_seeds:
            self.family = generic_match(problem)
        if self.family is not None:
            self.family.target = judge.backend.device
        self.rng = random.Random(config.seed)
        self.results: dict[str, EvalResult] = {}
        self.tokens: dict[str, int] = {}
        self.failed_steps = 0
        self.final_ratios: dict[str, float] = {}
        self.judged = 0
        self.accepted = 0
        self.reused = 0
        self.seed_speedup: float | None = None
        self.wall_before = 0.0
        self.end: float | None = None  # the run's deadline (time.monotonic), from time_limit_s
        # The search's judgments' own seconds and seconds holding the device alone, to foresee the final ones'.
        self.search_s: list[tuple[float, float]] = []
        self.room: Room | None = None
        self.mutator = self._make_mutator()

    # ------------------------------------------------------------------ setup
    def _make_mutator(self) -> Any:
        embedded = EmbeddedMutator(self.family, inductor=self.config.inductor_seeds)
        if self.config.llm is None:
            return embedded
        from ks_inductor.evolve.mutators.llm import LLMMutator

        return LLMMutator(self.config.llm, embedded)

    def _start(self) -> tuple[str, Archive, dict[str, Any]]:
        self.store.upsert_problem(self.problem)
        cfg = self.config
        run_id = None
        state: dict[str, Any] | None = None
        if cfg.resume:
            run_id = self.store.latest_run(self.problem.key, self.fp, unfinished_only=True)
            if run_id:
                state = self.store.load_run_state(run_id)
        if run_id and state and "archive" in state:
            log.info("resuming run %s of %s", run_id, self.problem.name)
            archive = Archive.from_json(state["archive"])
            self.judged = int(state.get("judged", 0))
            self.accepted = int(state.get("accepted", 0))
            self.reused = int(state.get("reused", 0))
            self.failed_steps = int(state.get("failed_steps", 0))
            self.seed_speedup = state.get("seed_speedup")
            self.wall_before = float(state.get("wall_s", 0.0))
            self.tokens = dict(state.get("tokens", {}))
            return run_id, archive, state
        run_id = run_id or self.store.start_run(self.problem.key, self.fp, cfg.to_json())
        archive = Archive(cfg.islands, cfg.elite_size, cfg.margin, migration_interval=cfg.migration_interval)
        return run_id, archive, {}

    def _inductor_reason(self) -> str:
        """Why Inductor's code gave no seed, in a few words (its first variant's reason)."""
        if not self.config.inductor_seeds or self.family is None:
            return "Inductor seeds are off"
        from ks_inductor.seeds.families import INDUCTOR

        reasons = INDUCTOR.unavailable(self.family)
        return next(iter(reasons.values()), "Inductor's code gave none") if reasons else "Inductor's code gave none"

    def _save(self, run_id: str, archive: Archive, wall: float, judged: int | None = None) -> None:
        self.store.save_run_state(run_id, {
            "archive": archive.to_json(), "judged": self.judged if judged is None else judged, "accepted": self.accepted,
            "reused": self.reused, "failed_steps": self.failed_steps, "seed_speedup": self.seed_speedup, "wall_s": wall,
            "tokens": self.tokens,
        })

    # ------------------------------------------------------------------ the loop
    def run(self) -> EvolveSummary:
        cfg = self.config
        t0 = self.started if self.started is not None else time.monotonic()
        self.t0 = t0
        run_id, archive, _ = self._start()
        if cfg.time_limit_s is not None:
            self.end = t0 + cfg.time_limit_s - self.wall_before
        prepare = getattr(self.judge, "prepare", None)
        if prepare is not None:
            prepare(self.problem, self.end)  # the reference runs while the seeds are made
        ctx = MutationContext(self.problem, self.family, archive, hardware_facts(self.judge), self.results)
        made = _Background(self.mutator.seeds, ctx)  # the seeds' code generation, beside the room's measurement
        self.room = self._measure_room()
        at = self._settle_at()
        if self.room is not None and at is not None and self.room.settled(at):
            return self._finish(run_id, archive, self.wall_before + time.monotonic() - t0, "settled")
        seeds = [c for c in made.result() if not archive.is_seen(c.source_hash)]
        if not seeds and not archive.correct_programs() and not archive.programs:
            raise EvolveError(
                f"no seed for {self.problem.name} (ops: {', '.join(self.problem.op_summary)}): no op-family template "
                f"covers it and {self._inductor_reason()}; configure an LLM endpoint to write a first kernel "
                "(--llm-base-url/--llm-model, or KERNELSMITH_LLM_BASE_URL and KERNELSMITH_LLM_MODEL)")
        parallel = cfg.parallel or (2 if self.judge.backend.device == "cpu" else 4)
        pending: dict[Future[EvalResult], dict[str, Any]] = {}
        since_retime = 0
        attempts = 0
        max_attempts = max(20, cfg.budget * 4)
        stop_reason = "budget"
        island_rr = 0
        bar = _Bar(self.progress, self.problem.name, cfg.budget, self.judged)

        def search_end() -> float | None:
            # The search stops early enough for the final judgments to fit in the limit.
            return None if self.end is None else self.end - self._final_reserve()

        def time_left() -> bool:
            end = search_end()
            return end is None or time.monotonic() < end

        def submit(cand: Candidate, info: dict[str, Any]) -> None:
            cached = None if info["kind"] == "retime" else self._stored_verdict(cand.source_hash)
            if cached is not None:
                self._absorb(run_id, archive, cand, info, cached, bar, cached=True)
                return
            # What has not finished by the end of the search is abandoned (killed), not waited for.
            fut = self.judge.submit(self.problem, cand.source, deadline=search_end())
            self.judged += 1
            bar.advance()
            pending[fut] = {**info, "cand": cand}

        def seen(h: str) -> bool:
            return archive.is_seen(h) or any(i["cand"].source_hash == h for i in pending.values())

        def saved_judged() -> int:
            return self.judged - len(pending)  # in-flight judgments are lost on interruption; redo them

        try:
            while True:
                while (len(pending) < parallel and self.judged < cfg.budget and time_left()
                       and attempts < max_attempts):
                    attempts += 1
                    if seeds:
                        cand = seeds.pop(0)
                        seed_mut = getattr(self.mutator, "seed_steps", {}).get(cand.id) or Mutation(cand.mutation, cand)
                        self._count_tokens(seed_mut)
                        submit(cand, {"kind": "seed", "parent": None, "island": island_rr % cfg.islands,
                                      "mutation": seed_mut})
                        island_rr += 1
                        continue
                    if (self.timed and since_retime >= cfg.retime_every and archive.best() is not None
                            and not any(i["kind"] == "retime" for i in pending.values())):
                        best = archive.best()
                        since_retime = 0
                        submit(Candidate.from_json(best.candidate), {"kind": "retime", "program": best.id})
                        continue
                    if not archive.programs or (not archive.correct_programs() and pending):
                        break  # wait for the seeds before mutating
                    island = island_rr % cfg.islands
                    island_rr += 1
                    parent = archive.select_parent(island, self.rng)
                    if parent is None and pending:
                        break
                    if parent is None and not archive.correct_programs():
                        parent = archive.repair_parent(self.rng)
                    if parent is None:
                        stop_reason = "no correct program to improve"
                        break
                    muts = self.mutator.propose([(parent, island)], ctx, self.rng)
                    for mut in muts:
                        self._count_tokens(mut)
                        if mut.candidate is None:
                            self._failed_step(run_id, archive, parent, island, mut)
                            continue
                        if seen(mut.candidate.source_hash):
                            continue
                        since_retime += 1
                        submit(mut.candidate, {"kind": "child", "parent": parent, "island": island,
                                               "mutation": mut})
                if not pending:
                    if self.judged >= cfg.budget:
                        stop_reason = "budget"
                    elif not time_left():
                        stop_reason = "time"
                    elif attempts >= max_attempts:
                        stop_reason = "no new candidates (every mutation was already judged or failed)"
                    break
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    info = pending.pop(fut)
                    res = fut.result()
                    if _abandoned(res):
                        # Cut off by the time limit: no verdict on the candidate, so nothing is recorded of it (a
                        # resumed run judges it again).
                        self.judged -= 1
                        continue
                    if _transient(res) and not info.get("retried"):
                        # The judge itself failed (not the candidate): judge it once more.
                        log.warning("judge failure on %s, retrying: %s", info["cand"].id, res.error)
                        pending[self.judge.submit(self.problem, info["cand"].source, deadline=search_end())] = {
                            **info, "retried": True}
                        continue
                    if info["kind"] != "retime" and res.duration_s:
                        self.search_s.append((res.own_s, res.device_held_s.get("exclusive", 0.0)))
                    self._absorb(run_id, archive, info["cand"], info, res, bar)
                    bar.done()
                self._save(run_id, archive, self.wall_before + time.monotonic() - t0, saved_judged())
                if not time_left():
                    stop_reason = "time"
            if not time_left():
                stop_reason = "time"
        except BaseException:
            # Interrupted (Ctrl-C, an unreachable LLM endpoint): keep what was learned for --resume.
            for fut in pending:
                fut.cancel()
            try:
                self._save(run_id, archive, self.wall_before + time.monotonic() - t0, saved_judged())
            except Exception as e:  # noqa: BLE001
                log.warning("could not save the run state: %s", e)
            bar.close()
            raise
        bar.close()
        return self._finish(run_id, archive, self.wall_before + time.monotonic() - t0, stop_reason)

    # ------------------------------------------------------------------ room
    def _settle_at(self) -> float | None:
        if self.config.settle_at is not None:
            return self.config.settle_at
        return SETTLE_AT if self.timed else None

    def _measure_room(self) -> Room | None:
        """The region's room, measured by the judge from the baselines the search is timed against, and stored for
        explain and the backend; None on the interpreter unless a settle threshold was asked for."""
        measure = getattr(self.judge, "room", None)
        if measure is None or self._settle_at() is None:
            return None
        try:
            room = measure(self.problem, self.end)
        except Exception as e:  # noqa: BLE001 - without a room the search runs, as it would on the interpreter
            log.warning("%s: the room was not measured (%s: %s); searching", self.problem.name, type(e).__name__, e)
            return None
        log.info("%s: %s", self.problem.name, room.summary())
        try:
            self.store.put_room(self.problem.key, self.fp.id, room.to_json())
        except Exception as e:  # noqa: BLE001 - a measurement the next run takes again
            log.warning("could not store the room of %s: %s", self.problem.name, e)
        return room

    # ------------------------------------------------------------------ time
    def _final_estimate(self, leaders: int | None = None) -> float:
        """Rough seconds the final judgments take (0 before the search has judged anything): one final judgment's own
        time, plus the device time of the others that queue for the same device's timing lock. The leaders of the
        searches beside this one on the same judge (``parallel_regions``) queue there too: searches that share a
        deadline judge their leaders at the same time. Costs come from the judge's finished final judgments, else
        from this search's judgments (``FINAL_COST``, ``FINAL_HELD_COST``)."""
        if not self.search_s:
            return 0.0
        sharing = max(1, self.config.parallel_regions or 1)
        leaders = self.config.final_candidates if leaders is None else leaders
        per_device = -(-leaders * sharing // max(1, getattr(self.judge, "device_count", 1)))
        typical = getattr(self.judge, "typical_cost", None)
        seen = typical(True) if typical is not None else None
        if seen is None:
            seen = (FINAL_COST * statistics.median(c[0] for c in self.search_s),
                    FINAL_HELD_COST * statistics.median(c[1] for c in self.search_s))
        own, held = seen
        return own + (per_device - 1) * held

    def _final_reserve(self) -> float:
        """Seconds kept at the end of a time-limited run for the final judgments (timed backends only): their
        estimate, within a share of the limit; where all the leaders' would not fit, the search's best's alone
        (``_finish`` then judges only that one)."""
        limit = self.config.time_limit_s
        if not self.timed or self.config.final_candidates <= 0 or limit is None:
            return 0.0
        most = FINAL_RESERVE_MAX * limit
        estimate = self._final_estimate()
        if estimate > most:
            estimate = self._final_estimate(leaders=1)
        return min(most, max(FINAL_RESERVE_MIN * limit, estimate))

    # ------------------------------------------------------------------ results
    def _count_tokens(self, mut: Mutation) -> None:
        for k, v in mut.tokens.items():
            self.tokens[k] = self.tokens.get(k, 0) + int(v)

    def _failed_step(self, run_id: str, archive: Archive, parent: Program, island: int, mut: Mutation) -> None:
        self.failed_steps += 1
        archive.failures[parent.id] = archive.failures.get(parent.id, 0) + 1
        self.store.add_step(StepRecord(
            run_id=run_id, problem_key=self.problem.key, child_id="", mutation=mut.kind, parent_id=parent.id,
            diff=mut.diff, prompt=mut.prompt, response=mut.response, verdict="failed", correct=False,
            parent_speedup=parent.score if parent.timed else None, feedback=mut.error or "",
            parent_source=Candidate.from_json(parent.candidate).source, island=island, tokens=mut.tokens))

    def _stored_verdict(self, source_hash: str) -> EvalResult | None:
        """The verdict the cache keeps for this candidate on this machine (a resumed run's earlier judgment), where
        it was reached by the rules this run judges by (``same_rules``)."""
        data = self.store.get_evaluation(self.problem.key, source_hash, self.fp.id)
        res = EvalResult.from_json(data) if data is not None else None
        return res if res is not None and same_rules(res, self.config) else None

    def _absorb(self, run_id: str, archive: Archive, cand: Candidate, info: dict[str, Any], res: EvalResult,
                bar: _Bar, cached: bool = False) -> None:
        if not cached:
            try:
                self.store.add_evaluation(self.problem.key, cand.source_hash, res, run_id)
            except Exception as e:  # noqa: BLE001 - a lost evaluation row must not lose the run
                log.warning("could not store an evaluation: %s", e)
        if info["kind"] == "retime":
            pid = info["program"]
            if res.verdict == ACCEPTED and res.correct:
                archive.update_measurement(pid, res.score, res.score_lcb, res.candidate_ms)
                self.results[pid] = res
            else:
                log.warning("elite %s failed its re-check (%s); demoted", pid, res.verdict)
                archive.demote(pid)
            bar.set_best(archive.best())
            return
        mut: Mutation = info["mutation"]
        descriptor = mut.descriptor or self.mutator.descriptor(cand)
        parent: Program | None = info["parent"]
        prog = _program_from(cand, res, descriptor, info["island"])
        if cached:
            self.reused += 1
        if prog.correct:
            self.accepted += 0 if cached else 1
        elif parent is not None:
            archive.failures[parent.id] = archive.failures.get(parent.id, 0) + 1
        archive.add(prog)
        self.results[prog.id] = res
        if info["kind"] == "seed" and prog.correct:
            self.seed_speedup = max(self.seed_speedup or 0.0, prog.score)
        if archive.step_island(info["island"]):
            archive.migrate(info["island"])
        noise = None
        c = res.timings.get("candidate")
        if c is not None and c.median_ms:
            noise = c.iqr_ms / c.median_ms
        parent_src = Candidate.from_json(parent.candidate).source if parent else ""
        delta = None
        if parent is not None and parent.timed and prog.timed and prog.correct:
            delta = prog.score - parent.score
        from ks_inductor.evolve.operators.feedback import step_gain

        self.store.add_step(StepRecord(
            run_id=run_id, problem_key=self.problem.key, child_id=cand.id, mutation=mut.kind,
            parent_id=parent.id if parent else None, diff=mut.diff, prompt=mut.prompt, response=mut.response,
            verdict=res.verdict, correct=prog.correct,
            parent_speedup=parent.score if parent and parent.timed else None,
            child_speedup=prog.score if prog.timed else None,
            parent_speedup_lcb=parent.lcb if parent and parent.timed else None,
            child_speedup_lcb=prog.lcb if prog.timed else None, speedup_delta=delta, noise=noise,
            gain=step_gain(parent, prog) if parent is not None else None,
            feedback=res.feedback_text()[-4000:], parent_source=parent_src, child_source=cand.source,
            island=info["island"], tokens=mut.tokens, fingerprint=res.fingerprint or self.fp.to_json()))
        bar.set_best(archive.best())

    def _final_end(self, leader: int) -> float | None:
        """The deadline of a leader's final judgment: the run's, and for the first leader (the search's best) a
        grace beyond it (``EvolveConfig.final_grace_s``, by default ``FINAL_GRACE_SHARE`` of the limit)."""
        if self.end is None or leader > 0 or self.config.time_limit_s is None:
            return self.end
        grace = self.config.final_grace_s
        return self.end + (FINAL_GRACE_SHARE * self.config.time_limit_s if grace is None else grace)

    def _final_judgment(self, run_id: str, archive: Archive,
                        leaders_n: int | None = None) -> tuple[Program | None, EvalResult | None, int]:
        """Judge the leading elites again with the judge's final protocol (full timing, Inductor among the
        baselines) and return the winner by that judgment: what gets served must have beaten every baseline
        under the protocol the benchmarks use, not just the search's short one against eager. The leaders'
        judgments share one timing of the baselines (``Judge`` times them once for judgments close together), so
        their scores compare with one another; each leader runs in a process of its own. The third value
        counts the leaders whose final judgment the run's time limit cut off. ``leaders_n``: how many leaders
        (default ``final_candidates``)."""
        n = self.config.final_candidates if leaders_n is None else leaders_n
        leaders = [archive.programs[e] for e in archive.elites[:n]]
        sources = [Candidate.from_json(p.candidate).source for p in leaders]
        futs = []
        for i, (prog, src) in enumerate(zip(leaders, sources)):
            futs.append((prog, src, self.judge.submit(self.problem, src, final=True, deadline=self._final_end(i))))
            self.judged += 1
        finals: list[tuple[int, Program, EvalResult]] = []
        cut = 0
        for i, (prog, src, fut) in enumerate(futs):
            res = fut.result()
            if _transient(res):
                res = self.judge.evaluate(self.problem, src, final=True, deadline=self._final_end(i))
            if _abandoned(res):
                cut += 1
                self.judged -= 1
                continue
            try:
                self.store.add_evaluation(self.problem.key, prog.source_hash, res, run_id)
            except Exception as e:  # noqa: BLE001
                log.warning("could not store an evaluation: %s", e)
            if res.correct and res.timing_meaningful:
                finals.append((i, prog, res))
            elif res.verdict != "error":
                log.warning("elite %s failed its final judgment: %s", prog.id, "; ".join(res.reasons[:2]))
                archive.demote(prog.id)
        if not finals:
            return None, None, cut
        self.final_ratios = head_to_head(finals)
        return (*pick_final(finals), cut)

    def _finish(self, run_id: str, archive: Archive, wall: float, stop_reason: str) -> EvolveSummary:
        best = archive.best()
        record = None
        best_res = self.results.get(best.id) if best else None
        if best is not None and best_res is None:  # judged before a resume: its verdict is in the cache
            best_res = self._stored_verdict(best.source_hash)
        final = None
        note = ""
        unverified = False  # the final protocol did not judge what is stored
        if self.timed and best is not None and self.config.final_candidates > 0:
            left = None if self.end is None else self.end - time.monotonic()
            end = self._final_end(0)
            if end is not None and end - time.monotonic() < FINAL_MIN_S:
                unverified = True
                note = (f"the final protocol was not run: {max(left, 0.0):.1f} s of the {self.config.time_limit_s:g} s "
                        f"limit were left and it takes about {self._final_estimate(leaders=1):.0f} s here")
            else:
                search_best, search_res = best, best_res
                short = left is not None and left < FINAL_START_SHARE * self._final_estimate()
                best, final, cut = self._final_judgment(run_id, archive, 1 if short else None)
                best_res = final
                if cut and final is None:
                    best, best_res, unverified = search_best, search_res, True
                    note = (f"the time limit of {self.config.time_limit_s:g} s cut off the final protocol's "
                            "judgments")
                elif cut:
                    note = f"the time limit cut off the final judgment of {cut} leader(s); chosen among the others"
        if unverified:
            note += ("; the search's best is stored as rejected (never served) until a run with more time judges "
                     "it with the final protocol")
            log.warning("%s: %s", self.problem.name, note)
        if best is not None and best_res is not None:
            cand = Candidate.from_json(best.candidate)
            status = VERIFIED
            if self.timed and (unverified or not best_res.faster):
                # Correct but not shown reliably faster than the baselines under the final protocol: kept for the
                # record, never served by the compile backend. A launch-bound kernel not slower on the device goes
                # to packs, where a stack's load-time race times its call as served and decides.
                status = RACE if not unverified and best_res.served_by_race else REJECTED
            if best_res.verdict == "quarantined":
                status = QUARANTINED
            eager = best_res.timings.get("eager")
            ind = best_res.timings.get("inductor")
            record = KernelRecord(
                problem_key=self.problem.key, source=cand.source, backend=self.fp.backend,
                fingerprint=self.fp.to_json(), status=status, launch_params=dict(cand.params),
                op_family=self.family.family if self.family else None,
                median_ms=(best_res.candidate_ms if final is not None else
                           (min(best.median_ms) if best.median_ms else None)) if self.timed else None,
                eager_ms=eager.median_ms if eager else None, inductor_ms=ind.median_ms if ind else None,
                speedup_eager=best_res.speedup_eager, speedup_inductor=best_res.speedup_inductor,
                speedup_lcb=best_res.speedup_best_lcb if self.timed else None,
                speedup_graph=min(best_res.steady_speedups.values(), default=None) if self.timed else None,
                trials=best_res.trials, timed=self.timed,
                run_id=run_id, parent_id=cand.parent_id, candidate_id=cand.id, plan=best_res.plan)
            record.id = self.store.add_kernel(record)
        # Request counters from the LLM client (tokens were already counted step by step).
        self.tokens.update({k: v for k, v in getattr(self.mutator, "usage", {}).items()
                            if k not in ("prompt_tokens", "completion_tokens")})
        wall = max(wall, self.wall_before + time.monotonic() - self.t0)  # the final judgments included
        summary = EvolveSummary(
            problem_key=self.problem.key, best=record, best_result=best_res, judged=self.judged,
            accepted=self.accepted, wall_s=wall, run_id=run_id, seed_speedup=self.seed_speedup,
            best_speedup=best.score if best and self.timed else None,
            family=self.family.family if self.family else None, timed=self.timed, failed_steps=self.failed_steps,
            stop_reason=stop_reason, tokens=dict(self.tokens), head_to_head=dict(self.final_ratios), note=note,
            reused=self.reused, why=why_no_kernel(record, best_res, note, list(self.results.values()), stop_reason),
            room=self.room.to_json() if self.room is not None else None)
        if best is not None:
            steps = lineage(archive, best.id)
            won = winning_move(steps)
            summary.lineage = [st.to_json() for st in steps]
            summary.winning_move = won.to_json() if won is not None else None
        if stop_reason == "settled" and self.room is not None:
            summary.why = _one_line(f"settled, no search: {self.room.summary()}")
        self._save(run_id, archive, wall)
        self.store.finish_run(run_id, summary.to_json())
        return summary


class _Background:
    """``fn(*args)`` on a daemon thread, in the caller's context (the code generation's deadline is a context
    variable): a settled region does not wait for (or keep the process up for) seeds it will not judge."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        ctx = contextvars.copy_context()
        threading.Thread(target=self._run, args=(ctx, fn, args), daemon=True, name="ks-seeds").start()

    def _run(self, ctx: contextvars.Context, fn: Any, args: tuple) -> None:
        try:
            self._value = ctx.run(fn, *args)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            self._error = e
        finally:
            self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


# Longest one-line "why" a summary carries; the verdicts keep every reason in full.
WHY_CHARS = 240


def why_no_kernel(record: KernelRecord | None, best: EvalResult | None, note: str, results: list[EvalResult],
                  stop_reason: str) -> str:
    """Why a search stored nothing that will be served, in one line; "" where it stored a verified kernel.

    The best candidate's verdict speaks first (its first reason, or why it is not faster); with no correct
    candidate, the first judged candidate's (the seeds come first, and their reason is the family's); with no
    verdict at all, why the search stopped."""
    if record is not None and record.status == VERIFIED:
        return ""
    if record is not None and note:
        return _one_line(note)
    if best is not None and best.reasons:
        return _one_line(best.reasons[0])
    if best is not None and best.not_faster:
        return _one_line(best.not_faster)
    for res in results:
        if res.reasons:
            return _one_line(res.reasons[0])
    return _one_line(f"no candidate was judged ({stop_reason})" if stop_reason else "no candidate was judged")


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= WHY_CHARS else flat[:WHY_CHARS - 1] + "…"


def head_to_head(finals: list[tuple[int, Program, EvalResult]]) -> dict[str, float]:
    """Per leader after the first (by program id): the first leader's final score over that leader's (above 1: the
    first leader is faster), both against the same timing of the baselines."""
    first = next((r for i, _, r in finals if i == 0), None)
    if first is None or not first.score:
        return {}
    return {prog.id: first.score / r.score for i, prog, r in finals if i > 0 and r.score}


# Another leader replaces the first only when the first runs at most this much below it: among leaders within a
# percent of one another (on the H200 the norms' three leaders stood 0.01-1.4% apart) the archive's order stands,
# rather than whichever one a judgment's noise favoured.
HEAD_TO_HEAD_BAND = 0.01


def pick_final(finals: list[tuple[int, Program, EvalResult]]) -> tuple[Program, EvalResult]:
    """The winner among leaders' final judgments (``(leader index, program, result)``). Only leaders that qualify
    to be served (accepted and faster than every baseline) compete when any does. Among those, the leader whose
    score leader 0's is furthest below wins if leader 0's is below 1 - ``HEAD_TO_HEAD_BAND`` of it, else leader 0.
    Where leader 0 does not qualify, the larger score wins."""
    served = [f for f in finals if f[2].verdict == ACCEPTED and f[2].faster]
    pool = served or finals
    first = next((f for f in pool if f[0] == 0), None)
    if served and first is not None:
        ratios = head_to_head(pool)
        contenders = [f for f in pool if f[1].id in ratios]
        if contenders:
            best = min(contenders, key=lambda f: ratios[f[1].id])
            return (best[1], best[2]) if ratios[best[1].id] < 1.0 - HEAD_TO_HEAD_BAND else (first[1], first[2])
        return first[1], first[2]
    _, prog, res = max(pool, key=lambda f: (f[2].verdict == ACCEPTED and f[2].faster, f[2].score or 0.0))
    return prog, res


def _abandoned(res: EvalResult) -> bool:
    """The judgment was cut off by the run's time limit (``Judge.submit(deadline=...)``): no verdict."""
    return res.verdict == "error" and (res.error or "") == DEADLINE_ERROR


def _transient(res: EvalResult) -> bool:
    return res.verdict == "error" and (res.error or "").startswith("judge failure")


class _Bar:
    """A rich progress bar showing judgments spent and the best verified score (speedup) so far."""

    def __init__(self, enabled: Any, name: str, total: int, done: int) -> None:
        # Anything but a bool is someone else's view of the run (``evolve_problem``'s ``progress``).
        self.sink = None if isinstance(enabled, bool) else enabled
        self.enabled = enabled is True
        self.name = name
        self.best = "-"
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # Progress is not a result: it goes to stderr, so that stdout carries only what a command prints as one.
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), transient=False,
                                 console=Console(stderr=True))
        self.task = self.progress.add_task(name, total=total, completed=done, best="-")
        self.progress.start()

    def advance(self) -> None:
        if self.sink is not None:
            self.sink.advance()
        if self.enabled:
            self.progress.advance(self.task)

    def done(self) -> None:
        if self.sink is not None:
            self.sink.done()

    def set_best(self, prog: Program | None) -> None:
        if prog is None:
            return
        self.best = f"{prog.score:.3f}x" if prog.timed else "correct (untimed)"
        if self.sink is not None:
            self.sink.set_best(self.best)
        if self.enabled:
            self.progress.update(self.task, best=self.best)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()


def same_rules(res: EvalResult, config: EvolveConfig) -> bool:
    """Whether a stored verdict's speed decision holds for a run with ``config``: a timed verdict decided with or
    without the CUDA-graph timing (``in_graphs``, a pack for transformers or a compiled graph sharing one cache) is
    not reused where the other rule applies."""
    return not res.timing_meaningful or res.in_graphs == config.in_graphs


def search_judge(config: EvolveConfig) -> RoomJudge:
    """The judge an optimizer run makes for itself: the short search protocol, the run's backend and trials."""
    from ks_inductor.judge import Judge

    return Judge(search_judge_config(config))


def search_judge_config(config: EvolveConfig) -> Any:
    """The settings of :func:`search_judge`'s judge: what a search is timed with and against."""
    from ks_inductor.judge import JudgeConfig

    jc = JudgeConfig.for_search(backend=config.backend)
    if config.baselines:
        unknown = set(config.baselines) - {"eager", "inductor"} - set(config.peers)
        if unknown:
            raise ValueError(f"baselines {sorted(unknown)}: a search times eager, inductor and the peers its "
                             "config names (EvolveConfig.peers)")
        jc.baselines = jc.final_baselines = tuple(config.baselines)
    jc.peers = dict(config.peers)
    jc.in_graphs = config.in_graphs
    if config.judge_trials:
        jc.trials = config.judge_trials
    return jc


def evolve_problem(problem: Problem, config: EvolveConfig, store: SearchStore, judge: SearchJudge | None = None,
                   progress: Any = True) -> EvolveSummary:
    """Evolve a faster verified kernel for ``problem``; the winner goes to ``store``. ``config.time_limit_s``
    bounds the whole call, the judge's start and the final judgments included, except that the final judgment of
    the search's best may take up to ``FINAL_GRACE_SHARE`` of the limit more. ``progress``: True for a progress
    bar, False for none, or an object told of the run's progress (``advance()`` per judgment submitted, ``done()``
    per verdict, ``set_best(text)``), as ``warm`` uses to show several runs at once."""
    from ks_inductor.seeds.inductor.generate import codegen_deadline

    started = time.monotonic()
    own = judge is None
    if own:
        judge = search_judge(config)
    try:
        # Inductor's code generation for the seeds (tens of seconds for some regions on a CPU) is part of the run.
        with codegen_deadline(None if config.time_limit_s is None else started + config.time_limit_s):
            return Evolver(problem, config, store, judge, progress, started=started).run()
    finally:
        if own:
            judge.close()
        else:
            judge.release(problem)  # a shared judge (warm) keeps no GB-scale reference of a finished search
